"""Found by the differential harness (tests/differential, seed 3), minimised:

none today: fixed on main (issue 39); kept as a regression test

In words: fsdp_mini.FSDP vs FSDP1 on 2 ranks; Net(width 4, depth 1) wrapped with {'policy': 'none', 'strategy':
'FULL_SHARD'}; sgd; steps: load_state_dict(of=model)

fsdp_mini and PyTorch (FSDP1) differ on the program below; this test passes once they agree.
"""
from differential.check import assert_agrees

DESCRIPTION = {'seed': 3,
 'design': 'flat',
 'world': 2,
 'model': {'width': 4, 'depth': 1},
 'wrap': {'policy': 'none', 'strategy': 'FULL_SHARD', 'hsdp': False, 'compile': None},
 'optim': {'kind': 'sgd', 'lr': 0.1},
 'steps': [{'op': 'load_state_dict', 'of': 'model'}]}


def test_found_load_state_dict_returns_incompatible_keys(no_orphans):
    assert_agrees(DESCRIPTION)
