"""Found by the differential harness (tests/differential, seed 100004), minimised:

step 0 (checkpoint) raises, rank 0: fsdp_mini raised ValueError: checkpoint <folder>/100004-2-fsdp_mini-0 does
not match the model: missing keys ['optim.emb.weight.momentum_buffer', 'optim.emb.bias.momentum_buffer',
'optim.blocks.0.lin.weight.momentum_buffer', 'optim.blocks.0.lin.bias.momentum_buffer',
'optim.heads.main.weight.momentum_buffer', ; torch did not

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'none', 'strategy':
'FULL_SHARD'}; sgd; steps: checkpoint(rewrap={'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False,
'compile': None})

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 100004,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'checkpoint',
            'rewrap': {'policy': 'none',
                       'strategy': 'FULL_SHARD',
                       'hsdp': False,
                       'compile': None}}]}
