"""Found by the differential harness (tests/differential, seed 65878085), minimised:

step 3 (train) raises, rank 0: torch raised RuntimeError: expected dtype torch.bfloat16 for `end`, but got
dtype torch.float64; fsdp_mini did not

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'root',
'reshard_after_forward': True}; adamw; steps: to(dtype=bfloat16), checkpoint(rewrap={'policy': 'root', 'hsdp':
False, 'reshard_after_forward': True, 'compile': None}), to(dtype=float64), train

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65878085,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'adamw', 'lr': 0.1},
 'steps': [{'op': 'to', 'dtype': 'bfloat16'},
           {'op': 'checkpoint',
            'rewrap': {'policy': 'root',
                       'hsdp': False,
                       'reshard_after_forward': True,
                       'compile': None}},
           {'op': 'to', 'dtype': 'float64'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
