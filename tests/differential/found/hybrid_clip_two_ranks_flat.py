"""Found by the differential harness (tests/differential, seed 66440015, as hybrid_clip_after_a_reload_on_two_ranks_flat.py
without its checkpoints, so that the unsharded model runs beside it):

step 0 (train) clip_norm, rank 0: 1.28839 vs 0.673089 (the unsharded model: 1.28839)

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'blocks', 'strategy':
'HYBRID_SHARD'}; sgd; steps: train with clip_grad_norm_(0.5)

FSDP1's norm is not the unsharded model's (known.py: "FSDP1's clip_grad_norm_ under HYBRID_SHARD on two ranks");
test_found.py checks fsdp_mini against the unsharded model, which agrees.
"""

DESCRIPTION = {'seed': 66440015,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'blocks', 'strategy': 'HYBRID_SHARD', 'hsdp': True, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'train', 'accum': 1, 'no_sync': False, 'clip': 0.5}]}
