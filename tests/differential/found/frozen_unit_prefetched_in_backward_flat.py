"""Found by the differential harness (tests/differential, seed 65350492), minimised:

step 2 (train) collectives, rank 0: all_gather 6 vs 5

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'linear', 'strategy':
'FULL_SHARD'}; sgd; steps: train, freeze(path=emb), train

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""


DESCRIPTION = {'seed': 65350492,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'linear', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'freeze', 'path': 'emb'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
