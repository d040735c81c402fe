"""Found by the differential harness (tests/differential, seed 65350117), minimised:

step 1 (checkpoint) raises, rank 0: torch raised RuntimeError: Missing key in checkpoint state_dict:
optim.state.heads.aux.bias.momentum_buffer.; fsdp_mini did not

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1, unused) wrapped with {'policy': 'linear',
'strategy': 'FULL_SHARD'}; sgd; steps: train, checkpoint(rewrap={'policy': 'linear', 'strategy': 'FULL_SHARD',
'hsdp': False, 'compile': None})

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65350117,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'unused': True},
 'wrap': {'policy': 'linear', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'checkpoint',
            'rewrap': {'policy': 'linear',
                       'strategy': 'FULL_SHARD',
                       'hsdp': False,
                       'compile': None}}]}
