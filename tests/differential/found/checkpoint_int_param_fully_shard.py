"""Found by the differential harness (tests/differential, seed 65350592), minimised:

step 2 (checkpoint) raises, rank 0: fsdp_mini raised RuntimeError: For integral input tensors, argument alpha
must not be a floating point number.; torch did not

In words: fully_shard vs FSDP2 on 4 ranks; Net(width 8, depth 2, int_buffer, bool_buffer, int_param) wrapped with
{'policy': 'blocks', 'hsdp': True, 'reshard_after_forward': True}; sgd; steps: nograd, train(accum=3),
checkpoint(rewrap={'policy': 'partial', 'hsdp': True, 'reshard_after_forward': False, 'compile': None}), eval,
to(dtype=bfloat16), freeze(path=blocks.1)

fsdp_mini and PyTorch (FSDP2) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 65350592,
 'design': 'per_param',
 'world': 4,
 'model': {'width': 8, 'depth': 2, 'int_buffer': True, 'bool_buffer': True, 'int_param': True},
 'wrap': {'policy': 'blocks', 'hsdp': True, 'reshard_after_forward': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'nograd'},
           {'op': 'train', 'accum': 3, 'no_sync': False, 'clip': None},
           {'op': 'checkpoint',
            'rewrap': {'policy': 'partial',
                       'hsdp': True,
                       'reshard_after_forward': False,
                       'compile': None}},
           {'op': 'eval'},
           {'op': 'to', 'dtype': 'bfloat16'},
           {'op': 'freeze', 'path': 'blocks.1'}]}
