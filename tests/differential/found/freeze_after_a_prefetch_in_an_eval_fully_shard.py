"""Found by the differential harness (tests/differential, seed 66293192), minimised:

step 2 (train) clip_norm, rank 0 [vs the unsharded model]: 1.37826 vs 1.34146

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 2, reuse) wrapped with {'policy': 'blocks'}; sgd; steps:
eval, freeze(path=blocks.1), train(clip=0.5)

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 66293192,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 2, 'reuse': True},
 'wrap': {'policy': 'blocks', 'hsdp': False, 'reshard_after_forward': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'eval'},
           {'op': 'freeze', 'path': 'blocks.1'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': 0.5}]}
