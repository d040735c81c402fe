"""Found by the differential harness (tests/differential, seed 66293422), minimised:

step 2 (end) raises, rank 0: torch raised AssertionError: FSDP assumes emb.weight is in the state_dict but the
state_dict only has odict_keys(['blocks.0.lin.weight', 'blocks.0.lin.bias']). prefix=, module_name=emb.,
param_name=weight rank=0.; fsdp_mini did not

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1, frozen) wrapped with {'policy': 'blocks',
'strategy': 'NO_SHARD'}; sgd; steps: freeze(path=heads.main), train

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 66293422,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'frozen': True},
 'wrap': {'policy': 'blocks', 'strategy': 'NO_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.05},
 'steps': [{'op': 'freeze', 'path': 'heads.main'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
