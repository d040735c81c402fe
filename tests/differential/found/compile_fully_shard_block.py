"""Found by the differential harness (tests/differential, seed 92), minimised:

step 0 (train) raises, rank 0: fsdp_mini raised BackendCompilerFailed: backend='aot_eager' raised:; torch did
not

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'blocks',
'reshard_after_forward': True, 'compile': 'blocks'}; sgd; steps: train

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
Fixed on main since (merge 75cff24): kept as a regression test.
"""

DESCRIPTION = {'seed': 92,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'blocks', 'hsdp': False, 'reshard_after_forward': True, 'compile': 'blocks'},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
