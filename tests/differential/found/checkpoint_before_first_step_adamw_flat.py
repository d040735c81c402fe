"""Found by the differential harness (tests/differential, seed 65352745), minimised:

step 2 (train) losses, rank 0 [vs the unsharded model: PyTorch raised]: [0.163193] vs [0.185865]

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1, int_param) wrapped with {'policy': 'none',
'strategy': 'FULL_SHARD'}; adamw; steps: checkpoint(rewrap={'policy': 'none', 'strategy': 'FULL_SHARD',
'hsdp': False, 'compile': None}), train, train

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65352745,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'int_param': True},
 'wrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'adamw', 'lr': 0.1},
 'steps': [{'op': 'checkpoint',
            'rewrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None}},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
