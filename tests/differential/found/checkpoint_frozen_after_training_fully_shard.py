"""Found by the differential harness (tests/differential, seed 65350413), minimised:

step 2 (checkpoint) raises, rank 0: fsdp_mini raised ValueError: checkpoint <folder>/65350413-3-fsdp_mini-2
does not match the model: unexpected keys ['optim.blocks.0.lin.bias.momentum_buffer',
'optim.blocks.0.lin.weight.momentum_buffer'] (the checkpoint's optimizer state is momentum_buffer; this
optimizer's: momentum_buffer); torch did not

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'root',
'reshard_after_forward': True}; sgd; steps: train, freeze(path=blocks.0), checkpoint(rewrap={'policy': 'root',
'hsdp': False, 'reshard_after_forward': True, 'compile': None})

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65350413,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'freeze', 'path': 'blocks.0'},
           {'op': 'checkpoint',
            'rewrap': {'policy': 'root',
                       'hsdp': False,
                       'reshard_after_forward': True,
                       'compile': None}}]}
