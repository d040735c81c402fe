"""Found by the differential harness (tests/differential, seed 65351660), minimised:

step 2 (state_dict) state, rank 0 [vs the unsharded model: PyTorch raised]: blocks.0.lin.bias: values differ
by up to 0.0256 (e.g. [0.0464194118976593, -0.12392234057188034, -0.16518722474575043] vs
[0.020793594419956207, -0.14953407645225525, -0.19082486629486084])

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1, int_param) wrapped with {'policy': 'none',
'strategy': 'FULL_SHARD'}; adamw; steps: checkpoint(rewrap={'policy': 'none', 'strategy': 'FULL_SHARD',
'hsdp': False, 'compile': None}), train, state_dict(of=owner)

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65351660,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'int_param': True},
 'wrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'adamw', 'lr': 0.1},
 'steps': [{'op': 'checkpoint',
            'rewrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None}},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'state_dict', 'of': 'owner'}]}
