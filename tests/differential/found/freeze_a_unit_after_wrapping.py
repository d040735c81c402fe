"""Found by the differential harness (tests/differential, seed 37), minimised:

none today: fixed on main (issue 39); kept as a regression test

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 2) wrapped with {'policy': 'blocks', 'strategy':
'FULL_SHARD'}; sgd; steps: freeze(path=blocks.1), train(clip=0.5)

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 37,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 2},
 'wrap': {'policy': 'blocks', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'freeze', 'path': 'blocks.1'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': 0.5}]}
