"""Found by the differential harness (tests/differential, seed 66117951), minimised:

step 0 (train) collectives, rank 0: all_gather 5 vs 6

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1, frozen) wrapped with {'policy': 'linear',
'reshard_after_forward': True}; sgd; steps: train

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 66117951,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'frozen': True},
 'wrap': {'policy': 'linear', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
