"""Found by the differential harness (tests/differential, seed 65350156), minimised:

step 1 (checkpoint) raises, rank 0: torch raised RuntimeError: Missing key in checkpoint state_dict:
optim.state.heads.aux.weight.momentum_buffer.; fsdp_mini did not

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1, unused) wrapped with {'policy': 'root',
'reshard_after_forward': True}; sgd; steps: train, checkpoint(rewrap={'policy': 'root', 'hsdp': False,
'reshard_after_forward': True, 'compile': None})

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65350156,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'unused': True},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'checkpoint',
            'rewrap': {'policy': 'root',
                       'hsdp': False,
                       'reshard_after_forward': True,
                       'compile': None}}]}
