"""Found by the differential harness (tests/differential, seed 28), minimised:

none today: fixed on main (issue 39); kept as a regression test

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'blocks', 'strategy':
'FULL_SHARD'}; sgd; steps: to(dtype=bfloat16), train

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 28,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'blocks', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'to', 'dtype': 'bfloat16'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
