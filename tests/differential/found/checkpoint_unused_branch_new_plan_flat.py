"""Found by the differential harness (tests/differential, seed 66383172), minimised:

step 2 (checkpoint) raises, rank 0: fsdp_mini raised ValueError: checkpoint <folder>/66383172-6-fsdp_mini-2
does not match the model: missing keys ['optim.heads.aux.weight.momentum_buffer',
'optim.heads.aux.bias.momentum_buffer'] (the checkpoint's optimizer state is momentum_buffer; this
optimizer's: momentum_buffer); torch did not

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1, unused) wrapped with {'policy': 'none', 'strategy':
'FULL_SHARD'}; sgd; steps: checkpoint(world=4, rewrap={'policy': 'linear', 'strategy': 'HYBRID_SHARD', 'hsdp':
True, 'compile': None}), train, checkpoint(rewrap={'policy': 'blocks', 'strategy': 'NO_SHARD', 'hsdp': False,
'compile': None})

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 66383172,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'unused': True},
 'wrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'checkpoint',
            'world': 4,
            'rewrap': {'policy': 'linear',
                       'strategy': 'HYBRID_SHARD',
                       'hsdp': True,
                       'compile': None}},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'checkpoint',
            'rewrap': {'policy': 'blocks',
                       'strategy': 'NO_SHARD',
                       'hsdp': False,
                       'compile': None}}]}
