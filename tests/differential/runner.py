"""One description on one implementation, on this rank: an observation (plain data and CPU tensors).

The observation is a list of events, one per step that ran ("wrap" first), each a dict of what that step
showed: losses, the clip norm, which gradients are None, collectives issued per kind, state-dict keys
and values (full tensors), what load_state_dict returned, the optimizer's state, outputs of eval and
no-grad forwards. A step that raises ends the program: its event holds the error's type and first line.
Every rank runs every step on its own data (the batch is seeded by seed, step, micro-batch and rank).
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import fsdp_mini.collectives as mini_collectives
from differential import wrapping
from differential.models import Owner, build

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


class CollectiveCounter:
    """Count the collectives both implementations issue, by kind, while active. Patches the
    torch.distributed functions FSDP1/FSDP2 call by attribute and the names fsdp_mini's builtins go
    through (as tests/fsdp2_calls.py does; FSDP1 gathers CPU tensors with the list form,
    `dist.all_gather`); a call made inside another counted call is not counted twice."""

    NAMES = {"all_gather": "all_gather", "all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
             "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
             "all_reduce": "all_reduce"}
    MINI = {"torch_all_gather_into_tensor": "all_gather", "torch_reduce_scatter_tensor": "reduce_scatter"}

    def __init__(self):
        self.counts: dict[str, int] = {}
        self._depth = 0

    def _wrap(self, kind, original):
        def call(*args, **kwargs):
            if self._depth == 0:
                self.counts[kind] = self.counts.get(kind, 0) + 1
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1
        return call

    def __enter__(self):
        self._saved = []
        for module, names in ((dist, self.NAMES), (mini_collectives, self.MINI)):
            for name, kind in names.items():
                if hasattr(module, name):
                    original = getattr(module, name)
                    self._saved.append((module, name, original))
                    setattr(module, name, self._wrap(kind, original))
        return self

    def __exit__(self, *exc):
        for module, name, original in self._saved:
            setattr(module, name, original)


def full(t):
    """A whole CPU copy of a tensor (a DTensor gathered); other values as they are."""
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().cpu().clone() if torch.is_tensor(t) else t


def error_text(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


class Program:
    """The state of one run: the model (`top`: the owner or the wrapped net), the wrapped net, the
    optimizer (made at its first use, so `.to()` before training is seen), the dtype of the inputs."""

    def __init__(self, desc: dict, impl: str, folder: str):
        self.desc, self.impl, self.folder = desc, impl, folder
        self.design, self.rank = desc["design"], dist.get_rank()
        self.opt = None
        self.dtype = torch.float32
        self.top, self.wrapped = self._build(desc["seed"], desc["wrap"])

    def _build(self, seed, spec):
        top = build(self.desc["model"], seed)
        wrapped = wrapping.wrap(top, self.design, spec, self.impl)
        return (top if isinstance(top, Owner) else wrapped), wrapped

    def optimizer(self):
        if self.opt is None:
            o = self.desc["optim"]
            params = list(self.top.parameters())
            self.opt = (torch.optim.SGD(params, lr=o["lr"], momentum=0.9) if o["kind"] == "sgd" else
                        torch.optim.AdamW(params, lr=o["lr"], eps=1e-3, weight_decay=0.1))
        return self.opt

    def batch(self, step: int, micro: int):
        g = torch.Generator().manual_seed(self.desc["seed"] * 1000 + step * 50 + micro * 7 + self.rank)
        return torch.randn(4, self.desc["model"]["width"], generator=g).to(self.dtype)

    def fsdp_modules(self):
        cls = wrapping.fsdp_module_class(self.impl)
        return [m for m in self.wrapped.modules() if isinstance(m, cls)]

    def no_sync(self, on: bool):
        if not on:
            return contextlib.nullcontext()
        if self.design == "flat":
            return self.wrapped.no_sync()

        @contextlib.contextmanager
        def unsynced():
            for m in self.fsdp_modules():
                m.set_requires_gradient_sync(False, recurse=False)
            try:
                yield
            finally:
                for m in self.fsdp_modules():
                    m.set_requires_gradient_sync(True, recurse=False)
        return unsynced()

    def state(self, of: str) -> dict:
        target = self.top if of == "owner" else self.wrapped
        return {k: full(v) for k, v in target.state_dict().items()}

    def optim_state(self) -> dict:
        """Per-parameter optimizer state by parameter name (the per-parameter design only: the flat
        design's state lives on flat shards, whose layout is each implementation's own)."""
        if self.opt is None or self.design == "flat":
            return {}
        return {f"{n}.{k}": full(v) for n, p in self.top.named_parameters() if p in self.opt.state
                for k, v in self.opt.state[p].items()}

    # --- the steps -------------------------------------------------------------------------------

    def train(self, i, s):
        opt, losses = self.optimizer(), []
        with CollectiveCounter() as counter:
            for j in range(s["accum"]):
                with self.no_sync(s["no_sync"] and j < s["accum"] - 1):
                    loss = self.top(self.batch(i, j)).float().pow(2).mean()
                    loss.backward()
                losses.append(loss.item())
        out = {"losses": losses, "collectives": counter.counts}
        if self.design == "per_param":
            out["grad_is_none"] = sorted(n for n, p in self.top.named_parameters() if p.grad is None)
        if s["clip"]:
            if self.design == "flat":
                out["clip_norm"] = float(self.wrapped.clip_grad_norm_(s["clip"]))
            else:
                out["clip_norm"] = float(full(torch.nn.utils.clip_grad_norm_(list(self.top.parameters()), s["clip"])))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out

    def eval(self, i, s, train_mode=False):
        was = self.top.training
        self.top.train(train_mode)
        try:
            with torch.no_grad():
                out = self.top(self.batch(i, 0))
        finally:
            self.top.train(was)
        return {"output_sum": float(out.float().sum())}

    def nograd(self, i, s):
        return self.eval(i, s, train_mode=True)

    def state_dict(self, i, s):
        return {"state": self.state(s["of"])}

    def load_state_dict(self, i, s):
        target = self.top if s["of"] == "owner" else self.wrapped
        sd = target.state_dict()
        new = {k: (v + 0.25 if torch.is_floating_point(v) else v) for k, v in sd.items()}
        ret = target.load_state_dict(new)
        returned = (("IncompatibleKeys", sorted(ret.missing_keys), sorted(ret.unexpected_keys))
                    if hasattr(ret, "missing_keys") else repr(ret))
        return {"returned": returned, "state": self.state(s["of"])}

    def freeze(self, i, s, flag=False):
        wrapping.submodule(self.wrapped, self.design, s["path"]).requires_grad_(flag)
        return {}

    def unfreeze(self, i, s):
        return self.freeze(i, s, flag=True)

    def to(self, i, s):
        self.dtype = DTYPES[s["dtype"]]
        self.top.to(self.dtype)
        return {"dtypes": sorted({str(p.dtype) for p in self.top.parameters()})}

    def checkpoint(self, i, s):
        """Save model and optimizer, build a fresh model (other values) wrapped as `rewrap` says, load into
        it, and go on with that one: fsdp_mini.checkpoint against torch.distributed.checkpoint."""
        self.optimizer()
        path = os.path.join(self.folder, f"{self.desc['seed']}-{self.desc.get('index', 0)}-{self.impl}-{i}")
        old_dtype = self.dtype
        if self.impl == "fsdp_mini":
            from fsdp_mini.checkpoint import load_checkpoint, save_checkpoint
            save_checkpoint(path, self.top, self.opt)
        else:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
            msd, osd = get_state_dict(self.top, self.opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        self.top, self.wrapped = self._build(self.desc["seed"] + 1, s["rewrap"])
        if old_dtype != torch.float32:
            self.top.to(old_dtype)
        self.opt = None
        opt = self.optimizer()
        if self.impl == "fsdp_mini":
            load_checkpoint(path, self.top, opt)
        else:
            msd, osd = get_state_dict(self.top, opt)
            sd = {"model": msd, "optim": osd}
            dcp.load(sd, checkpoint_id=path)
            set_state_dict(self.top, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        return {"state": self.state("model"), "optim_state": self.optim_state()}


def run(desc: dict, impl: str, folder: str) -> list[dict]:
    """The events of `desc` on `impl` on this rank (see the module doc)."""
    events = []
    try:
        program = Program(desc, impl, folder)
    except BaseException as exc:  # noqa: BLE001 - an error is an observation
        return [{"op": "wrap", "error": error_text(exc)}]
    events.append({"op": "wrap", "state": program.state("model")})  # the owner's: its own steps
    for i, step in enumerate(desc["steps"]):
        try:
            event = getattr(program, step["op"])(i, step)
        except BaseException as exc:  # noqa: BLE001 - DCP raises CheckpointException, a BaseException
            events.append({"op": step["op"], "error": error_text(exc)})
            break
        events.append({"op": step["op"], **event})
    else:
        try:
            events.append({"op": "end", "state": program.state("model"), "optim_state": program.optim_state()})
        except BaseException as exc:  # noqa: BLE001 - DCP raises CheckpointException, a BaseException
            events.append({"op": "end", "error": error_text(exc)})
    return events
