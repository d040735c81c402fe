"""Found by the differential harness (tests/differential, seed 100055), minimised:

step 0 (train) collectives, rank 0: all_gather 2 vs 1

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'none', 'strategy':
'SHARD_GRAD_OP'}; sgd; steps: train(accum=2, no_sync=True)

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 100055,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'none', 'strategy': 'SHARD_GRAD_OP', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'train', 'accum': 2, 'no_sync': True, 'clip': None}]}
