"""Found by the differential harness (tests/differential, seed 66442522), minimised:

step 1 (load_state_dict) state, rank 0 [vs the unsharded model]: model.heads.aux.bias: values differ by up to
0.00223 (e.g. [0.2565893828868866, 0.02892380952835083, 0.31273794174194336] vs [0.2566559314727783,
0.02669072151184082, 0.3133716583251953])

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1, owner, unused, int_param) wrapped with {'policy':
'none', 'strategy': 'FULL_SHARD'}; adamw; steps: train, load_state_dict(of=owner)

fsdp_mini and PyTorch (FSDP1) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""

DESCRIPTION = {'seed': 66442522,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1, 'owner': True, 'unused': True, 'int_param': True},
 'wrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'adamw', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': None},
           {'op': 'load_state_dict', 'of': 'owner'}]}
