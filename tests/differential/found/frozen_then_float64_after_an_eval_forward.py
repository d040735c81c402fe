"""Found by the differential harness (tests/differential, seed 65352560), minimised:

step 3 (train) grad_is_none, rank 0 [vs the unsharded model: PyTorch raised]: [] vs ['blocks.0.lin.bias',
'blocks.0.lin.weight']

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'root'}; sgd; steps: eval,
freeze(path=blocks.0), to(dtype=float64), train

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""


DESCRIPTION = {'seed': 65352560,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'eval'},
           {'op': 'freeze', 'path': 'blocks.0'},
           {'op': 'to', 'dtype': 'float64'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
