"""Found by the differential harness (tests/differential, seed 65350295), minimised:

step 3 (end) optim_state, rank 0: blocks.0.lin.bias.momentum_buffer: dtype torch.float64 vs torch.float32

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'root',
'reshard_after_forward': True}; sgd; steps: checkpoint(rewrap={'policy': 'root', 'hsdp': False,
'reshard_after_forward': True, 'compile': None}), to(dtype=float64), train

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65350295,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'checkpoint',
            'rewrap': {'policy': 'root',
                       'hsdp': False,
                       'reshard_after_forward': True,
                       'compile': None}},
           {'op': 'to', 'dtype': 'float64'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
