"""Found by the differential harness (tests/differential, seed 100202), minimised:

step 0 (train) raises, rank 0: fsdp_mini raised RuntimeError: The tensor has a non-zero number of elements,
but its data is not allocated yet.; torch did not

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 2, reuse, frozen, layernorm) wrapped with {'policy':
'group', 'reshard_after_forward': True}; sgd; steps: train

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 100202,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 2, 'reuse': True, 'frozen': True, 'layernorm': True},
 'wrap': {'policy': 'group', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
