"""Found by the differential harness (tests/differential, seed 65350377), minimised:

step 3 (train) losses, rank 0 [vs the unsharded model: PyTorch raised]: [0.233026] vs [0.198251]

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'root'}; sgd; steps: nograd,
train, to(dtype=float64), train

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""


DESCRIPTION = {'seed': 65350377,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'nograd'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'to', 'dtype': 'float64'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
