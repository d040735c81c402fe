"""Found by the differential harness (tests/differential, seed 7), minimised:

none today: fixed on main (issue 39); kept as a regression test

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1, nan_buffer) wrapped with {'policy': 'root',
'reshard_after_forward': True}; sgd; steps: train

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 7,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'nan_buffer': True},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
