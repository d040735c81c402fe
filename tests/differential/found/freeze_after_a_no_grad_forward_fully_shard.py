"""Found by the differential harness (tests/differential, seed 65877292), minimised:

step 2 (train) collectives, rank 0: all_gather 9 vs 6, reduce_scatter 6 vs 8

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 2) wrapped with {'policy': 'blocks'}; sgd; steps: nograd,
freeze(path=blocks.1), train(accum=3)

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65877292,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 2},
 'wrap': {'policy': 'blocks', 'hsdp': False, 'reshard_after_forward': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'nograd'},
           {'op': 'freeze', 'path': 'blocks.1'},
           {'op': 'train', 'accum': 3, 'no_sync': False, 'clip': None}]}
