"""Found by the differential harness (tests/differential, seed 100603), minimised:

step 0 (train) clip_norm, rank 0: 0.840648 vs 1.15567
step 0 (train) grad_is_none, rank 0: ['blocks.0.lin.bias', 'blocks.0.lin.weight', 'emb.bias',
'emb.weight'] vs ['emb.bias', 'emb.weight']  (fsdp_mini loses blocks.0's gradients)

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 2, reuse, frozen) wrapped with {'policy': 'group',
'reshard_after_forward': True}; sgd; steps: train(clip=0.5)

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 100603,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 2, 'reuse': True, 'frozen': True},
 'wrap': {'policy': 'group', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': 0.5}]}
