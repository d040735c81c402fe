"""Found by the differential harness (tests/differential, seed 65350534), minimised:

step 0 (checkpoint) raises, rank 0 [vs the unsharded model: PyTorch raised]: fsdp_mini raised RuntimeError:
For integral input tensors, argument alpha must not be a floating point number.; the unsharded model did not

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1, int_param) wrapped with {'policy': 'none',
'strategy': 'FULL_SHARD'}; sgd; steps: checkpoint(rewrap={'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp':
False, 'compile': None})

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65350534,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'int_param': True},
 'wrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'checkpoint',
            'rewrap': {'policy': 'none',
                       'strategy': 'FULL_SHARD',
                       'hsdp': False,
                       'compile': None}}]}
