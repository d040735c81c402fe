"""Found by the differential harness (tests/differential, seed 65877424), minimised:

step 2 (checkpoint) optim_state, rank 0: keys only in fsdp_mini: ['model.blocks.2.lin.bias.momentum_buffer',
'model.blocks.2.lin.weight.momentum_buffer']; only in torch: []

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 3, owner) wrapped with {'policy': 'root',
'reshard_after_forward': True}; sgd; steps: train, freeze(path=blocks.2), checkpoint(rewrap={'policy': 'root',
'hsdp': False, 'reshard_after_forward': True, 'compile': None})

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65877424,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 3, 'owner': True},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'freeze', 'path': 'blocks.2'},
           {'op': 'checkpoint',
            'rewrap': {'policy': 'root',
                       'hsdp': False,
                       'reshard_after_forward': True,
                       'compile': None}}]}
