"""THE list of known, deliberate differences between fsdp_mini and PyTorch, each with its reason.

The comparator sets a difference apart (reported as "known", not as a finding) when an entry's `applies`
says so. Keep it short and honest: a difference that is a bug goes in no list here; it stays a finding
until it is fixed. (Both raising is agreement already, whatever the messages say: no entry needed.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Known:
    name: str
    reason: str
    applies: Callable[[dict, object], bool]  # (description, Difference) -> bool


def _flat(desc) -> bool:
    return desc["design"] == "flat"


def _raised(diff, who: str, words: str) -> bool:
    return diff.field == "raises" and diff.text.startswith(f"{who} raised") and words in diff.text


def _strategies(desc) -> set[str]:
    return {desc["wrap"].get("strategy")} | {s["rewrap"].get("strategy") for s in desc["steps"] if "rewrap" in s}


def _only_kind_differs(diff, kind: str) -> bool:
    """A collective-count difference in `kind` only (the text names every kind that differs)."""
    return diff.field == "collectives" and all(part.startswith(kind + " ") for part in diff.text.split(", "))


def _after_forward_without_backward(desc, diff) -> bool:
    return any(s["op"] in ("eval", "nograd") for s in desc["steps"][:max(diff.step, 0)])


def _checkpoint_before_training(desc, diff) -> bool:
    """A checkpoint saved before the optimizer's first step, and what follows from loading it: PyTorch keeps
    state that fsdp_mini does not (keys only on torch's side), or PyTorch raises for want of param groups."""
    steps = desc["steps"]
    first_train = next((i for i, s in enumerate(steps) if s["op"] == "train"), len(steps))
    if not any(s["op"] == "checkpoint" for s in steps[:first_train]):
        return False
    if diff.field == "optim_state" and "keys only in fsdp_mini: [];" in diff.text:
        return True  # against the unsharded model too: it loads through the same DCP functions
    if diff.field == "optim_state" and ": dtype " in diff.text:
        return True  # fsdp_mini's state is made at the first step, in the dtype the parameters have by then
    # the unsharded reference loads through PyTorch's DCP state-dict functions too (runner.Program.load_fresh)
    if desc["optim"]["kind"] == "adamw" and diff.step > first_train:
        # AdamW resumed by PyTorch counts its loading step: step 1 more, and every update's bias correction
        # after it differs, so the values trained from there on differ (SGD's zero momentum is a fresh one)
        return diff.field in ("losses", "clip_norm", "grad_norm", "state", "optim_state", "output_sum")
    if _raised(diff, "torch", "expected dtype torch.") and any(s["op"] == "to" for s in steps):
        return True  # PyTorch's loading made AdamW's state in the dtype of then; after .to() its step mixes the two
    return _raised(diff, "torch", "Missing key in checkpoint state_dict: optim.param_groups")


def _optimizer_state_the_checkpoint_lacks(desc, diff) -> bool:
    """PyTorch raised on load because its loading step created state for a parameter the saved optimizer had
    none for (unused, so never stepped); fsdp_mini leaves that parameter's state fresh."""
    return any(s["op"] == "checkpoint" for s in desc["steps"]) and _raised(
        diff, "torch", "Missing key in checkpoint state_dict: optim.state.")


def _state_of_frozen_parameters(desc, diff) -> bool:
    """Optimizer state that only fsdp_mini holds after a load, all of it of parameters the program froze."""
    frozen = [s["path"] + "." for s in desc["steps"] if s["op"] == "freeze"]
    if not (frozen and diff.field == "optim_state" and diff.text.endswith("only in torch: []")):
        return False
    if desc["model"].get("tied") and {"emb.", "heads.main."} & set(frozen):
        frozen += ["emb.weight.", "heads.main.weight."]  # one parameter under two names (models.Net's tie)
    keys = diff.text.split("keys only in fsdp_mini: ")[1].split("; only in torch")[0].strip("[]").split(", ")
    return all(any(_under(k.strip("'"), f) for f in frozen) for k in keys)


def _under(key: str, path: str) -> bool:
    """Whether a state key is of a module at `path` ("blocks.2."), the owner's prefix ("model.") allowed."""
    return key.startswith(path) or f".{path}" in key


VALUES = ("losses", "output_sum", "clip_norm", "state", "optim_state", "grad_is_none")  # what a program computed


def _forward_without_backward_before_the_optimizer(desc) -> bool:
    """An eval or no-grad forward before the first training step (where runner.Program makes the optimizer)."""
    ops = [s["op"] for s in desc["steps"]]
    first_train = ops.index("train") if "train" in ops else len(ops)
    return any(op in ("eval", "nograd") for op in ops[:first_train])


def _frozen_somewhere(desc, diff) -> bool:
    """Part of the model frozen before the difference: at build time, or by a freeze step."""
    return bool(desc["model"].get("frozen")) or any(s["op"] == "freeze" for s in desc["steps"][:max(diff.step, 0) + 1])


def _hybrid_clip_on_two_ranks(desc, diff) -> bool:
    """A training step with clipping, before or at the difference, under HYBRID_SHARD on a world of 2 (the
    world and the wrapping a checkpoint's reload changes to included)."""
    world, strategy = desc["world"], desc["wrap"].get("strategy")
    for i, s in enumerate(desc["steps"][:max(diff.step, 0) + 1]):
        if s["op"] == "checkpoint":
            world = s.get("world", world)
            strategy = s.get("rewrap", {}).get("strategy", strategy)
        if s["op"] == "train" and s.get("clip") and world == 2 and strategy == "HYBRID_SHARD":
            return True
    return False


def _freeze_after_a_forward_without_backward(desc, diff) -> bool:
    """A freeze step, before the difference, that follows an eval or no-grad forward with no training step
    between them."""
    last_forward = None  # "train", or "eval"/"nograd": what ran last
    for s in desc["steps"][:max(diff.step, 0)]:
        if s["op"] in ("train", "eval", "nograd"):
            last_forward = s["op"]
        elif s["op"] == "freeze" and last_forward in ("eval", "nograd"):
            return True
    return False


def _to_after_a_forward(desc, diff) -> bool:
    steps = desc["steps"][:max(diff.step, 0)]
    return any(s["op"] == "to" and any(t["op"] in ("train", "eval", "nograd") for t in steps[:i])
               for i, s in enumerate(steps))


KNOWN: list[Known] = [
    Known("flat design: integer parameters",
          "fsdp_mini's flat design keeps one flat shard per (dtype, requires_grad) in a unit, so an int64 "
          "parameter gets a flat shard of its own (never reduced); FSDP1 refuses the unit ('Cannot flatten "
          "integer dtype tensors')",
          lambda d, x: _flat(d) and d["model"].get("int_param") and _raised(x, "torch", "Cannot flatten integer")),
    Known("flat design: a tie across units",
          "fsdp_mini refuses a parameter tied across two units (each unit's flat shard would hold its own "
          "copy); FSDP1 (use_orig_params=True) accepts it",
          lambda d, x: _flat(d) and d["model"].get("tied")
          and _raised(x, "fsdp_mini", "which is in another FSDP unit")),
    Known("fully_shard: a parameter shared by two units",
          "fsdp_mini refuses a parameter shared by two fully_shard units with a clear error (group them: "
          "fully_shard([a, b])); FSDP2 accepts the second fully_shard of an already sharded parameter without "
          "a word",
          lambda d, x: not _flat(d) and d["model"].get("tied")
          and _raised(x, "fsdp_mini", "is shared with another unit")),
    Known("flat design: NO_SHARD's gradient buckets",
          "fsdp_mini's NO_SHARD AllReduces gradients in DDP's buckets of bucket_cap_mb (one AllReduce for a small "
          "model); FSDP1's NO_SHARD AllReduces each flat parameter's gradient on its own",
          lambda d, x: _flat(d) and "NO_SHARD" in _strategies(d) and _only_kind_differs(x, "all_reduce")),
    Known("flat design: one flat shard per requires_grad",
          "fsdp_mini keeps a unit's frozen and trainable parameters in two flat shards (frozen ones get no "
          "gradient buffer and the optimizer never sees them), so it issues two AllGathers where FSDP1 "
          "(use_orig_params=True: one flat parameter per unit) issues one",
          lambda d, x: _flat(d) and (d["model"].get("frozen") or d["model"].get("int_param"))
          and _only_kind_differs(x, "all_gather")),
    Known("flat design: the root after a forward without backward",
          "FSDP1 leaves the root unit's parameters gathered after a forward that no backward follows (eval, "
          "no_grad), so its next forward skips their AllGather; fsdp_mini frees them (the root keeps them "
          "gathered only for the backward that follows a training forward): one AllGather more, less memory",
          lambda d, x: _flat(d) and _only_kind_differs(x, "all_gather") and _after_forward_without_backward(d, x)),
    Known("fully_shard: a unit used twice in one forward",
          "fsdp_mini keeps a unit that runs twice in a forward gathered through both of its backward passes and "
          "reduces its gradient once; FSDP2 reshards it after the first, gathers it again and ReduceScatters "
          "after each (and AllReduces across HSDP replicas after each): fewer collectives, same values (the values "
          "are compared as ever)",
          lambda d, x: not _flat(d) and d["model"].get("reuse") and x.field == "collectives"
          and all(p.split()[0] in ("all_gather", "reduce_scatter", "all_reduce") for p in x.text.split(", "))),
    Known("flat design: requires_grad_ after wrapping, on part of a flat parameter",
          "fsdp_mini trains a flat parameter as one tensor, so it refuses (with the fix in the message) freezing "
          "or unfreezing after wrapping unless it covers whole flat parameters; FSDP1 with use_orig_params=True "
          "accepts it (and keeps gradient and optimizer state for the frozen part of the flat parameter)",
          lambda d, x: _flat(d) and x.field == "raises" and x.text.startswith("fsdp_mini raised ValueError")
          and ("after FSDP: its parameters share the flat parameter" in x.text or "cannot unfreeze" in x.text)),
    Known("flat design: a dtype move after wrapping",
          "fsdp_mini refuses .to(dtype) after wrapping with the fix in the message (convert before wrapping, or "
          "MixedPrecision); FSDP1 takes the call and fails at the next forward ('Invalid usage of tensors with "
          "different dtypes')",
          lambda d, x: _flat(d) and x.field == "raises" and x.op == "to"
          and "FSDP holds its parameters in flat shards of" in x.text),
    Known("clip_grad_norm_ over DTensor and plain parameters together (PyTorch's limitation)",
          "with fully_shard on the blocks only (no root), the model mixes DTensor and plain parameters, and "
          "torch.nn.utils.clip_grad_norm_ refuses the mix for both implementations ('got mixed torch.Tensor and "
          "DTensor'); only the unsharded model clips",
          lambda d, x: not _flat(d) and x.against == "plain" and x.field == "raises"
          and "got mixed torch.Tensor and DTensor" in x.text),
    Known("fully_shard: .to(dtype) after a forward (a PyTorch bug)",
          "FSDP2 keeps the buffers it gathered into in the first forward in the old dtype, so after .to(float64) "
          "the next training step fails with 'Expected out tensor to have dtype double, but got float'; fsdp_mini "
          "trains in the new dtype (and agrees with the unsharded model, which the comparator then checks)",
          lambda d, x: not _flat(d) and _to_after_a_forward(d, x)
          and (_raised(x, "torch", "Expected out tensor to have dtype")
               or _raised(x, "torch", "mat1 and mat2 must have the same dtype"))),
    Known("flat design: DCP of FSDP1 when a rank holds none of a parameter (a PyTorch bug)",
          "torch.distributed.checkpoint's get_state_dict / set_state_dict of FSDP1 (use_orig_params=True) fail on "
          "load with 'Missing key in checkpoint state_dict: optim.param_groups' when some rank's flat shard holds "
          "no element of a parameter (a one-element parameter at world 2; a checkpoint saved after resharding "
          "across world sizes); fsdp_mini's checkpoint loads it (and agrees with the unsharded model)",
          lambda d, x: _flat(d) and _raised(x, "torch", "Missing key in checkpoint state_dict: optim.param_groups")),
    Known("flat design: FSDP1's state_dict under NO_SHARD with frozen parameters (a PyTorch bug)",
          "FSDP1 (use_orig_params=True) with NO_SHARD and a unit holding frozen parameters fails its own "
          "state_dict after training ('AssertionError: FSDP assumes emb.weight is in the state_dict but the "
          "state_dict only has ...'); fsdp_mini returns it (and agrees with the unsharded model)",
          lambda d, x: _flat(d) and "NO_SHARD" in _strategies(d) and _raised(x, "torch", "FSDP assumes")
          and "is in the state_dict" in x.text),
    Known("flat design: FSDP1's clip_grad_norm_ under HYBRID_SHARD on two ranks (a PyTorch bug)",
          "on a world of 2 with HYBRID_SHARD, FSDP1's clip_grad_norm_ returns a norm that is not the unsharded "
          "model's (0.673 where the unsharded model and fsdp_mini have 1.288, tests/differential/found/"
          "hybrid_clip_two_ranks_flat.py) and issues two AllReduces; the "
          "steps after it then differ too. On 4 ranks the three agree",
          lambda d, x: _flat(d) and (x.field in VALUES or _only_kind_differs(x, "all_reduce"))
          and _hybrid_clip_on_two_ranks(d, x)),
    Known("flat design: zero gradients for parameters a unit did not use",
          "the flat design reduces a flat parameter as one tensor, so a parameter that got no gradient gets "
          "zeros and AdamW's weight decay still moves it (documented in fsdp_mini/fsdp/fully_sharded_data_parallel.py; FSDP warns, naming "
          "it; FSDP1 does the same); the unsharded model leaves it untouched. Seen only against the unsharded "
          "model, when FSDP1 refused the program (an integer parameter)",
          lambda d, x: _flat(d) and x.against == "plain" and d["model"].get("unused")
          and x.field in ("state", "optim_state") and _under(x.text.split(": ")[0], "heads.aux.")),
    Known("fully_shard: DCP after a no-grad forward with reshard_after_forward=False (a PyTorch crash)",
          "torch.distributed.checkpoint's get_state_dict of an FSDP2 model whose parameters are still gathered "
          "after a forward under no_grad (reshard_after_forward=False) kills the rank with SIGSEGV; fsdp_mini "
          "saves it",
          lambda d, x: not _flat(d) and _raised(x, "torch", "SIGSEGV")
          and d["wrap"].get("reshard_after_forward") is False
          and any(s["op"] == "checkpoint" for s in d["steps"])),
    Known("fully_shard: a forward without gradients",
          "fsdp_mini frees every unit after a forward that no backward can follow (FSDPParamGroup.post_forward: "
          "no_grad, or no output needs a gradient), as its flat design does; FSDP2 keeps a unit with "
          "reshard_after_forward=False (the root, by default) gathered, so its next forward skips that AllGather "
          "(fsdp_mini: one more). And FSDP2 records every post-forward, a no-grad one too (_fsdp_param_group.py, "
          "`_record_post_forward`), so an evaluation forward before a training step leaves entries that the "
          "step's backward prefetches from: one AllGather of a unit it does not use (and a list an evaluation loop "
          "without backward grows forever); fsdp_mini records only forwards that a backward can follow "
          "(FSDPState._records_post_forward). Values agree",
          lambda d, x: not _flat(d) and _only_kind_differs(x, "all_gather") and _after_forward_without_backward(d, x)),
    Known("fully_shard: a unit no backward reaches is not prefetched",
          "a unit whose forward output needs no gradient (a frozen unit fed inputs that need none, e.g. a frozen "
          "embedding) is never gathered again in backward; fsdp_mini does not record its post-forward, so backward "
          "does not prefetch it (UnitLifecycle.post_forward, in both designs; FSDP1 skips it too: "
          "`_needs_pre_backward_unshard`); FSDP2 records it and its backward prefetch gathers the unit for nothing: one AllGather more "
          "per backward. Values agree",
          lambda d, x: not _flat(d) and _only_kind_differs(x, "all_gather") and _frozen_somewhere(d, x)
          and int(x.text.split()[1]) < int(x.text.split()[3])),  # "all_gather 5 vs 6": fsdp_mini's fewer
    Known("fully_shard: an optimizer made after a forward without gradients (a PyTorch silent loss)",
          "after a no-grad forward FSDP2 leaves a unit with reshard_after_forward=False (the root, by default) "
          "gathered, and its module's parameters are the gathered copies until a backward ends (pytorch#131965): "
          "the optimizer the program makes at its first training step holds them, and its steps move tensors "
          "that the next reshard discards, so those parameters never train. fsdp_mini freed the unit: its "
          "optimizer holds the sharded parameters (and the comparator checks fsdp_mini against the unsharded "
          "model, which it then runs)",
          lambda d, x: not _flat(d) and x.against == "torch" and x.field in VALUES
          and _forward_without_backward_before_the_optimizer(d)),
    Known("fully_shard: requires_grad_ after a forward without gradients (a PyTorch silent loss)",
          "after a no-grad forward FSDP2 leaves a unit with reshard_after_forward=False gathered, its module's "
          "parameters the gathered copies until a backward ends (pytorch#131965), so `requires_grad_(False)` "
          "then freezes the copies: the sharded parameters keep training (gradients, a ReduceScatter each, "
          "optimizer steps). fsdp_mini freed the unit: the freeze holds (and the comparator checks fsdp_mini "
          "against the unsharded model, which it then runs)",
          lambda d, x: not _flat(d) and x.against == "torch" and (x.field in VALUES or x.field == "collectives")
          and _freeze_after_a_forward_without_backward(d, x)),
    Known("a checkpoint saved before the optimizer's first step",
          "fsdp_mini loads it as a fresh optimizer (no state), which is what the saved optimizer was and what a "
          "run that never stopped has; PyTorch's set_optimizer_state_dict keeps the state its loading creates "
          "(`_init_optim_state`, a step on zero gradients: zero momentum buffers, AdamW's step 1 with zero moments, "
          "so its first update after the resume differs), or raises 'Missing key in checkpoint state_dict: "
          "optim.param_groups'",
          _checkpoint_before_training),
    Known("the optimizer state of a parameter frozen after training",
          "a checkpoint holds the state of a parameter trained, then frozen; fsdp_mini restores it (a resume "
          "that later unfreezes it goes on with its momentum), while PyTorch's set_optimizer_state_dict leaves "
          "it without state: its loading step gives zero gradients to trainable parameters only",
          _state_of_frozen_parameters),
    Known("a parameter the saved optimizer had no state for",
          "a parameter no step ever reached (an unused branch) has no optimizer state in the checkpoint; fsdp_mini "
          "leaves its state fresh, while PyTorch's set_optimizer_state_dict, whose loading step created state for "
          "it, raises 'Missing key in checkpoint state_dict: optim.state.<name>.<state>'",
          _optimizer_state_the_checkpoint_lacks),
]


def reason_for(desc: dict, diff) -> str | None:
    for k in KNOWN:
        if k.applies(desc, diff):
            return f"{k.name}: {k.reason}"
    return None
