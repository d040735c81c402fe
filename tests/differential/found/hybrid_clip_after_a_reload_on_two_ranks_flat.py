"""Found by the differential harness (tests/differential, seed 66440015), minimised:

step 2 (train) clip_norm, rank 0: 0.856422 vs 0.352149

In words: fsdp_mini.FSDP vs FSDP1 on 4 ranks; Net(width 4, depth 1) wrapped with {'policy': 'none', 'strategy':
'FULL_SHARD'}; sgd; steps: checkpoint(world=2, rewrap={'policy': 'linear', 'strategy': 'SHARD_GRAD_OP',
'hsdp': False, 'compile': None}), checkpoint(rewrap={'policy': 'blocks', 'strategy': 'HYBRID_SHARD', 'hsdp':
True, 'compile': None}), train(clip=0.5)

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 66440015,
 'design': 'flat',
 'world': 4,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'checkpoint',
            'world': 2,
            'rewrap': {'policy': 'linear',
                       'strategy': 'SHARD_GRAD_OP',
                       'hsdp': False,
                       'compile': None}},
           {'op': 'checkpoint',
            'rewrap': {'policy': 'blocks',
                       'strategy': 'HYBRID_SHARD',
                       'hsdp': True,
                       'compile': None}},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': 0.5}]}
