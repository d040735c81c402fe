"""Found by the differential harness (tests/differential, seed 66118349), minimised:

step 2 (checkpoint) optim_state, rank 0: keys only in fsdp_mini: ['emb.weight.momentum_buffer',
'heads.main.bias.momentum_buffer']; only in torch: []

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1, tied) wrapped with {'policy': 'root',
'reshard_after_forward': True}; sgd; steps: train, freeze(path=heads.main), checkpoint(rewrap={'policy':
'root', 'hsdp': False, 'reshard_after_forward': True, 'compile': None})

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 66118349,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'tied': True},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'freeze', 'path': 'heads.main'},
           {'op': 'checkpoint',
            'rewrap': {'policy': 'root',
                       'hsdp': False,
                       'reshard_after_forward': True,
                       'compile': None}}]}
