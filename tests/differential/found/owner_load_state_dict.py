"""Found by the differential harness (tests/differential, seed 6), minimised:

none today: fixed on main (issue 39); kept as a regression test

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1, owner) wrapped with {'policy': 'none', 'strategy':
'FULL_SHARD'}; sgd; steps: load_state_dict(of=owner)

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 6,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'owner': True},
 'wrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'load_state_dict', 'of': 'owner'}]}
