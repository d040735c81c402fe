"""Found by the differential harness (tests/differential, seed 65350189), minimised:

step 2 (end) state, rank 0 [vs the unsharded model: PyTorch raised]: blocks.0.lin.bias: values differ by up to
0.0128 (e.g. [-0.04445374384522438, -0.06123568117618561, 0.4292954206466675] vs [-0.0572652593255043,
-0.07405015826225281, 0.44210633635520935])

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1, int_param) wrapped with {'policy': 'none',
'strategy': 'FULL_SHARD'}; adamw; steps: checkpoint(rewrap={'policy': 'none', 'strategy': 'FULL_SHARD',
'hsdp': False, 'compile': None}), train

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65350189,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'int_param': True},
 'wrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'adamw', 'lr': 0.05},
 'steps': [{'op': 'checkpoint',
            'rewrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None}},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
