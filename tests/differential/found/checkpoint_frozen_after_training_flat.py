"""Found by the differential harness (tests/differential, seed 65350459), minimised:

step 2 (checkpoint) raises, rank 0: fsdp_mini raised ValueError: checkpoint <folder>/65350459-5-fsdp_mini-2
does not match the model: unexpected keys ['optim.blocks.1.lin.bias.exp_avg',
'optim.blocks.1.lin.bias.exp_avg_sq', 'optim.blocks.1.lin.bias.step', 'optim.blocks.1.lin.weight.exp_avg',
'optim.blocks.1.lin.weight.exp_avg_sq', 'optim.blocks.; torch did not

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 2) wrapped with {'policy': 'blocks', 'strategy':
'FULL_SHARD'}; adamw; steps: train, freeze(path=blocks.1), checkpoint(rewrap={'policy': 'blocks', 'strategy':
'FULL_SHARD', 'hsdp': False, 'compile': None})

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65350459,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 2},
 'wrap': {'policy': 'blocks', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'adamw', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'freeze', 'path': 'blocks.1'},
           {'op': 'checkpoint',
            'rewrap': {'policy': 'blocks',
                       'strategy': 'FULL_SHARD',
                       'hsdp': False,
                       'compile': None}}]}
