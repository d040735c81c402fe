"""Lesson 09's plumbing: the per-rank functions that run both designs and collect what the cells compare.

Why a module: a per-rank function that only trains, logs and gathers numbers into a dict teaches nothing the
lesson's cells do not already show (how each design wraps the model, what the optimizer sees, what FSDP1 says);
kept in the cells, it hid the one line that matters among forty. The cells pass in what they teach (the wrap
functions, the LoRA model, the optimizer groups) and read back plain dicts. The Russian readings of the
messages PyTorch and fsdp_mini print in this lesson live here too, beside the patterns they read.
"""
from __future__ import annotations

import re
import warnings
from collections import Counter

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor import DTensor

from fsdp_mini import FSDP, CommLog, full_state_dict
from fsdp_mini.fsdp._fully_shard.fully_shard import memory_stats
from fsdp_mini.course.language import num, plural
from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.course.show import text
from fsdp_mini.course.train import local_rows, train

__all__ = ["CFG", "design_name", "held", "max_difference", "bytes_per_step", "train_designs", "fine_tune",
           "lora_table", "fsdp1_lora", "train_with_groups", "first_line", "reading_of",
           "allgather_bytes_by_group_size"]

CFG = GPTConfig()
"""The course's GPT: 2 blocks, a vocabulary of 61 tokens (prime: nothing divides evenly)."""

_DESIGN_KEYS = {"flat": "flat_design", "per-parameter": "per_parameter_design"}


def design_name(design: str) -> str:
    """"flat" or "per-parameter" as the lesson's language names the design."""
    return text(_DESIGN_KEYS[design])


def held(model) -> list[tuple[str, str, tuple, tuple]]:
    """What the optimizer sees on this rank: (name, type, global shape, local shape) per parameter."""
    return [(name, type(p).__name__, tuple(p.shape),
             tuple(p.to_local().shape if isinstance(p, DTensor) else p.shape))
            for name, p in model.named_parameters()]


def max_difference(state: dict, reference: torch.nn.Module) -> float:
    """The largest |difference| between a full state dict and a one-process model's weights."""
    return max((state[k] - v).abs().max().item() for k, v in reference.state_dict().items())


def bytes_per_step(log: CommLog, steps: int) -> Counter:
    """Bytes on the wire per training step, by (unit, collective), from a CommLog of `steps` steps."""
    per_step = Counter()
    for r in log.records:
        per_step[(r.label, r.op)] += r.nbytes // steps
    return per_step


def train_designs(designs: dict, make_optimizer, steps: int = 3) -> dict:
    """Per rank: each design wraps a fresh GPT and trains `steps` steps under a CommLog; its losses, full
    state dict, bytes per step and what its optimizer sees."""
    out = {}
    for design, wrap in designs.items():
        model = wrap(GPT(CFG))
        with CommLog() as log:
            losses = train(model, make_optimizer(model.parameters()), CFG, steps=steps, batch_size=8)
        out[design] = {"losses": losses, "state": full_state_dict(model),
                       "bytes": bytes_per_step(log, steps), "held": held(model)}
    return out


def fine_tune(designs: dict, make_model, make_optimizer) -> dict:
    """Per rank: each design wraps `make_model()` (frozen weights, trainable adapters), trains 2 steps, then
    logs a third and measures memory after its backward, while the gradients are held."""
    out = {}
    for design, wrap in designs.items():
        model = wrap(make_model())
        opt = make_optimizer([p for p in model.parameters() if p.requires_grad])
        train(model, opt, CFG, steps=2, batch_size=8)
        x, y = (local_rows(t, dist.get_rank(), dist.get_world_size()) for t in make_batch(CFG, 8, step=2))
        with CommLog() as log:
            model(x, y).backward()
        stats = model.memory_stats(opt) if isinstance(model, FSDP) else memory_stats(model, opt)
        opt.step()
        tensors = [h.label for h in model.handles] if isinstance(model, FSDP) else [r[0] for r in held(model)]
        scatters = Counter()
        for r in log.records:
            if r.op == "reduce_scatter":
                scatters[r.label] += r.nbytes
        out[design] = {"stats": stats, "tensors": tensors, "scatters": scatters,
                       "gathers": Counter(r.label for r in log.records if r.op == "all_gather"),
                       "state": full_state_dict(model)}
    return out


def _block0(counts: Counter) -> int:
    return sum(n for label, n in counts.items() if label.startswith("blocks.0"))


def lora_table(result: dict) -> list[dict]:
    """One rank's `fine_tune` result as rows (a quantity, its value in each design): block 0's tensors,
    AllGathers and ReduceScatter bytes in the logged step, and the bytes per rank of each kind of state."""
    measures = {
        "block0_tensors": lambda r: len([t for t in r["tensors"] if t.startswith("blocks.0")]),
        "block0_allgathers": lambda r: _block0(r["gathers"]),
        "block0_reduce_scatter_bytes": lambda r: _block0(r["scatters"]),
        "param_bytes_per_rank": lambda r: r["stats"]["params"],
        "grad_bytes_per_rank": lambda r: r["stats"]["grads"],
        "optimizer_bytes_per_rank": lambda r: r["stats"]["optimizer"],
    }
    return [{"lora_quantity": text(key), "flat_design": measure(result["flat"]),
             "per_parameter_design": measure(result["per-parameter"])} for key, measure in measures.items()]


def first_line(error: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    return f"{type(error).__name__}: {str(error).splitlines()[0]}"


def fsdp1_lora(make_model, use_orig_params: bool, by_policy: bool) -> dict:
    """Per rank: PyTorch's FSDP1 on the LoRA GPT, each block a unit, wrapped by hand (bottom-up, as
    fully_shard is) or by lesson 08's auto-wrap policy. Returns the refusal, or the warnings about mixed
    `requires_grad` and the bytes of the flat parameters' gradients after one backward. device_id: FSDP1
    refuses a CPU run without it."""
    kwargs = {"device_id": torch.device("cpu"), "use_orig_params": use_orig_params}
    model = make_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if by_policy:
                model = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block}), **kwargs)
            else:
                for i, block in enumerate(model.blocks):
                    model.blocks[i] = FullyShardedDataParallel(block, **kwargs)
                model = FullyShardedDataParallel(model, **kwargs)
        except ValueError as e:
            return {"refused": first_line(e)}
    warned = [f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught
              if "requires_grad=True and False" in str(w.message)]
    x, y = (local_rows(t, dist.get_rank(), dist.get_world_size()) for t in make_batch(CFG, 8))
    model(x, y).backward()
    # each unit's one flat parameter (FSDP1's internal name): its gradient, after backward
    flat = [unit._flat_param for unit in FullyShardedDataParallel.fsdp_modules(model)]
    grads = sum(p.grad.numel() * p.grad.element_size() for p in flat if p.grad is not None)
    return {"warned": warned, "grad bytes": grads}


def train_with_groups(designs: dict, groups_by_name) -> dict:
    """Per rank: each design trains 3 AdamW steps with the optimizer groups `groups_by_name(model)` builds;
    the groups' sizes and the full state dict."""
    out = {}
    for design, wrap in designs.items():
        model = wrap(GPT(CFG))
        opt = torch.optim.AdamW(groups_by_name(model), lr=1e-2, eps=1e-3)
        train(model, opt, CFG, steps=3, batch_size=8)
        out[design] = ([len(g["params"]) for g in opt.param_groups], full_state_dict(model))
    return out


def allgather_bytes_by_group_size(log: CommLog) -> Counter:
    """Bytes this rank sent in AllGathers, by the size of the group they ran over."""
    sent = Counter()
    for r in log.records:
        if r.op == "all_gather":
            sent[r.group_size] += r.sent
    return sent


# --- the Russian readings of the messages this lesson prints ------------------------------------------------
# PyTorch's and fsdp_mini's messages, English as they are, each a pattern over the whole message and its Russian
# reading: a wording not listed here fails the cell.
_BOTH = "has both parameters with requires_grad=True and False"
_FROZEN_APART = "If possible, wrap the frozen parameters with FSDP separately"


def _elements(n: int) -> str:
    return plural(n, "элемент", "элемента", "элементов")


READINGS = [
    (r"ValueError: Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`",
     lambda m: "при use_orig_params=False в плоский параметр можно склеить только тензоры"
               " с одинаковым requires_grad"),
    (rf"ValueError: (?P<unit>\S+) {_BOTH}\. FSDP does not support wrapping such modules when"
     rf" use_orig_params=False\. {_FROZEN_APART}\.",
     lambda m: f"в {m['unit']} есть параметры и с requires_grad=True, и с False; при"
               " use_orig_params=False FSDP такие модули не оборачивает.\n    Если можно,"
               " оберните замороженные параметры в FSDP отдельно."),
    (rf"UserWarning: (?P<unit>\S+) {_BOTH}\. We do not recommend wrapping such modules since the"
     r" gradient memory usage will be higher than expected \((?P<all>\d+) numel instead of"
     rf" (?P<trained>\d+) numel before sharding via reduce-scatter\)\. {_FROZEN_APART}\.",
     lambda m: f"в {m['unit']} есть параметры и с requires_grad=True, и с False; оборачивать"
               " такие модули не рекомендуем: градиенты займут больше памяти, чем ожидается\n"
               f"    ({num(int(m['all']))} {_elements(int(m['all']))} вместо"
               f" {num(int(m['trained']))} до шардирования через ReduceScatter)."
               " Если можно, оберните замороженные параметры в FSDP отдельно."),
    (r"RuntimeError: (?P<module>\S+ \(\w+\)) is inside an FSDP wrapper and its parameters are"
     r" sharded: call the wrapper \(model\(\.\.\.\)\), or use it inside"
     r" `with model\.summon_full_params\(\):`",
     lambda m: f"{m['module']} находится внутри обёртки FSDP, и его параметры шардированы:"
               " вызывайте обёртку (model(...)) или работайте с модулем внутри"
               " `with model.summon_full_params():`"),
    (r"RuntimeError: (?P<op>\S+) got mixed torch\.Tensor and DTensor, need to convert all"
     r" torch\.Tensor to DTensor before calling distributed operators!",
     lambda m: f"{m['op']} получил вперемешку torch.Tensor и DTensor: прежде чем вызывать"
               " распределённые операторы, все torch.Tensor нужно превратить в DTensor"),
]


def reading_of(message: str) -> str:
    """The Russian reading of a message this lesson prints."""
    for pattern, reading in READINGS:
        m = re.fullmatch(pattern, message)
        if m:
            return reading(m)
    raise ValueError(f"no reading for {message!r}")
