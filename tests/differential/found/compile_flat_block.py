"""Found by the differential harness (tests/differential, seed 53), minimised:

step 0 (train) raises, rank 0: fsdp_mini raised InternalTorchDynamoError: RuntimeError: blocks.0.lin.weight is
sharded now: FSDP frees a unit's gathered parameters between uses, so the module holds no values for it. Read
parameters inside `with model.summon_full_params():`, or take the whole state with model.full_state_dict()
(fsdp_mini.full_state_dict(model)); torch did not

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'blocks', 'strategy':
'FULL_SHARD', 'compile': 'blocks'}; sgd; steps: train

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
Fixed on main since (merge 75cff24): kept as a regression test.
"""

DESCRIPTION = {'seed': 53,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'blocks', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': 'blocks'},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
