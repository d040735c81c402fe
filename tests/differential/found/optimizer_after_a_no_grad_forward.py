"""Found by the differential harness (tests/differential, seed 65350377, minimised, then the `.to` step left out):

step 1 (train) losses, rank 0: fsdp_mini trains the parameters of the root unit, FSDP2 does not (pytorch#131965)

In words: fully_shard vs FSDP2 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'root'}; sgd; steps: nograd,
train, train

fsdp_mini and PyTorch (FSDP2) differ on the program below, deliberately (known.py: "an optimizer made after a
forward without gradients"); test_found.py checks fsdp_mini against the unsharded model, which agrees.
"""


DESCRIPTION = {'seed': 65350377,
 'design': 'per_param',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'root', 'hsdp': False, 'reshard_after_forward': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'nograd'},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None}]}
