"""Found by the differential harness (tests/differential, seed 100039), minimised:

step 0 (checkpoint) raises, rank 0: fsdp_mini raised ValueError: checkpoint <folder>/100039-3-fsdp_mini-0 does
not match the model: missing keys ['optim.emb.weight.momentum_buffer', 'optim.emb.bias.momentum_buffer',
'optim.blocks.0.lin.weight.momentum_buffer', 'optim.blocks.0.lin.bias.momentum_buffer',
'optim.heads.main.weight.momentum_buffer', ; torch did not

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'root',
'reshard_after_forward': True}; sgd; steps: checkpoint(rewrap={'policy': 'root', 'hsdp': False,
'reshard_after_forward': True, 'compile': None})

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 100039,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'checkpoint',
            'rewrap': {'policy': 'root',
                       'hsdp': False,
                       'reshard_after_forward': True,
                       'compile': None}}]}
