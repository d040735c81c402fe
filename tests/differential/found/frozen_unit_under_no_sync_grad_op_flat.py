"""Found by the differential harness (tests/differential, seed 67326338), minimised:

step 1 (train) collectives, rank 0: all_gather 5 vs 3

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'linear', 'strategy':
'SHARD_GRAD_OP'}; sgd; steps: freeze(path=emb), train(accum=3, no_sync=True)

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 67326338,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'linear', 'strategy': 'SHARD_GRAD_OP', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'freeze', 'path': 'emb'},
           {'op': 'train', 'accum': 3, 'no_sync': True, 'clip': None}]}
