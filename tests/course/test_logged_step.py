"""logged_step (lessons 05 and 06): one FSDP step logged on every rank, the logs and counts the lessons read."""
import torch

from fsdp_mini import ShardingStrategy, launch
from fsdp_mini.course.logged_step import LoggedStep, logged_step
from fsdp_mini.course.models import GPT, GPTConfig
from fsdp_mini.course.trace import issue_order

CFG = GPTConfig(n_layer=2)


def test_one_full_shard_step_is_logged_on_every_rank():
    steps = launch(logged_step, 2, args=(CFG, ShardingStrategy.FULL_SHARD, False), timeout=120)
    whole = sum(4 * p.numel() for p in GPT(CFG).parameters())
    blocks = [f"blocks.{i}" for i in range(CFG.n_layer)]
    for rank, step in enumerate(steps):
        assert isinstance(step, LoggedStep)
        assert list(step.units) == ["root", *blocks] and sum(step.units.values()) == whole
        # only the logged step: one AllGather per unit in forward, again per block in backward
        assert sorted(issue_order(step.records)) == sorted(
            [("all_gather", u) for u in ["root", *blocks, *blocks]] + [("reduce_scatter", u) for u in step.units])
        assert {s.rank for s in step.spans} == {rank} and {s.label for s in step.spans} == set(step.units)
        assert {m.kind for m in step.memory} >= {"free"}
        assert step.after_forward == step.units["root"]  # the blocks were freed after their forward
        # measured after backward, before the optimizer step: the gradient shards are there
        assert step.stats["grads"] == step.stats["params"] == whole // 2
        assert step.stats["unsharded_peak"] == step.units["root"] + step.units["blocks.0"]
    assert torch.tensor([s.after_forward for s in steps]).unique().numel() == 1
