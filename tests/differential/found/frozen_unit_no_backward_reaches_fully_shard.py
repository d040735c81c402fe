"""Found by the differential harness (tests/differential, seed 65876480), minimised:

step 0 (train) collectives, rank 0: all_gather 4 vs 3

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1, frozen) wrapped with {'policy': 'linear'}; sgd; steps:
train

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65876480,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'frozen': True},
 'wrap': {'policy': 'linear', 'hsdp': False, 'reshard_after_forward': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
