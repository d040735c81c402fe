"""One description on one implementation, on this rank: an observation (plain data and CPU tensors).

The observation is a list of events, one per step that ran ("wrap" first; "i": the step's index in the
description, -1 for "wrap"), each a dict of what that step showed: losses, the clip norm, which gradients
are None, collectives issued per kind, state-dict keys and values (full tensors), what load_state_dict
returned, the optimizer's state, outputs of eval and no-grad forwards. A step that raises ends the
program: its event holds the error's type and first line. Every rank runs every step on its own data (the
batch is seeded by seed, step, micro-batch and rank). impl "plain" is the unsharded reference (see
execute.py): the same model unwrapped, its gradients averaged across ranks by `Program.average_grads`.
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
    failures = getattr(exc, "failures", None)  # DCP's CheckpointException: the first rank's own error
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        exc = inner[0] if isinstance(inner, tuple) else inner
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


class Program:
    """The state of one run: the model (`top`: the owner or the wrapped net), the wrapped net, the
    optimizer (made at its first use, so `.to()` before training is seen), the dtype of the inputs."""

    def __init__(self, desc: dict, impl: str, folder: str, build: bool = True):
        self.desc, self.impl, self.folder = desc, impl, folder
        self.design, self.rank = desc["design"], dist.get_rank()
        self.opt = None
        self.dtype = torch.float32
        self.frozen_paths: list[tuple[str, bool]] = []  # freeze / unfreeze after wrapping, replayed on a reload
        if build:
            self.top, self.wrapped = self._build(desc["seed"], desc["wrap"])

    def _build(self, seed, spec):
        self.spec = spec
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
        if not on or self.impl == "plain":
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
                unsynced = s["no_sync"] and j < s["accum"] - 1
                with self.no_sync(unsynced):
                    loss = self.top(self.batch(i, j)).float().pow(2).mean()
                    loss.backward()
                if self.impl == "plain" and not unsynced:
                    self.average_grads()
                losses.append(loss.item())
        out = {"losses": losses, "collectives": counter.counts}
        if self.design == "per_param":
            out["grad_is_none"] = sorted(n for n, p in self.top.named_parameters() if p.grad is None)
        if s["clip"]:
            if self.design == "flat" and self.impl == "plain":
                out["clip_norm"] = float(torch.nn.utils.clip_grad_norm_(list(self.wrapped.parameters()), s["clip"]))
            elif self.design == "flat":
                out["clip_norm"] = float(self.wrapped.clip_grad_norm_(s["clip"]))
            else:
                out["clip_norm"] = float(full(torch.nn.utils.clip_grad_norm_(list(self.top.parameters()), s["clip"])))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out

    def average_grads(self):
        """The unsharded reference's gradient sync: the mean over ranks of what a wrapping would reduce."""
        spec = self.spec
        for p in wrapping.synced_params(self.wrapped, self.design, spec):
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)

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
        self.frozen_paths.append((s["path"], flag))
        return {}

    def unfreeze(self, i, s):
        return self.freeze(i, s, flag=True)

    def to(self, i, s):
        self.dtype = DTYPES[s["dtype"]]
        self.top.to(self.dtype)
        return {"dtypes": sorted({str(p.dtype) for p in self.top.parameters()})}

    def path(self, i) -> str:
        return os.path.join(self.folder, f"{self.desc['seed']}-{self.desc.get('index', 0)}-{self.impl}-{i}")

    def save(self, i) -> None:
        """Save model and optimizer: fsdp_mini.checkpoint.sharded_checkpoint against torch.distributed.checkpoint (DCP)."""
        opt = self.optimizer()
        if self.impl == "fsdp_mini":
            from fsdp_mini.checkpoint import save_checkpoint
            save_checkpoint(self.path(i), self.top, opt, overwrite=True)  # a re-run launch saves again
        else:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict
            msd, osd = get_state_dict(self.top, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=self.path(i))

    def load_fresh(self, i, s) -> dict:
        """Build a fresh model (other values) wrapped as `rewrap` says, in the dtype the program computes
        in, load step i's checkpoint into it and its new optimizer, and go on with that one."""
        self.top, self.wrapped = self._build(self.desc["seed"] + 1, s["rewrap"])
        if self.dtype != torch.float32:
            self.top.to(self.dtype)
        for path, flag in self.frozen_paths:  # the model as it was saved: the same parts frozen
            wrapping.submodule(self.wrapped, self.design, path).requires_grad_(flag)
        self.opt = None
        opt = self.optimizer()
        if self.impl == "fsdp_mini":
            from fsdp_mini.checkpoint import load_checkpoint
            load_checkpoint(self.path(i), self.top, opt)
        else:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
            msd, osd = get_state_dict(self.top, opt)
            sd = {"model": msd, "optim": osd}
            dcp.load(sd, checkpoint_id=self.path(i))
            set_state_dict(self.top, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        return {"state": self.state("model"), "optim_state": self.optim_state()}

    def checkpoint(self, i, s):
        """Save, then load into a fresh model wrapped as `rewrap` says (on the same ranks; a step with
        "world" is split by `run` across two launches instead)."""
        self.save(i)
        return self.load_fresh(i, s)


def cross_world_step(desc: dict) -> int | None:
    """The index of the checkpoint step that loads at another world size (at most one per program)."""
    return next((i for i, s in enumerate(desc["steps"])
                 if s["op"] == "checkpoint" and s.get("world", desc["world"]) != desc["world"]), None)


def _steps(program: Program, desc: dict, first: int, last: int, events: list) -> bool:
    """Run steps first..last-1, appending their events; False once one raised."""
    for i in range(first, last):
        step = desc["steps"][i]
        try:
            event = getattr(program, step["op"])(i, step)
        except BaseException as exc:  # noqa: BLE001 - DCP raises CheckpointException, a BaseException
            events.append({"op": step["op"], "i": i, "error": error_text(exc)})
            return False
        events.append({"op": step["op"], "i": i, **event})
    return True


def run(desc: dict, impl: str, folder: str, phase: int = 1) -> list[dict]:
    """The events of `desc` on `impl` on this rank (see the module doc). A program with a checkpoint step
    that loads at another world size runs in two phases, each in its own launch: phase 1 up to that
    step's save (its last event "save"), phase 2 (at the step's world) from the load on."""
    events = []
    k = cross_world_step(desc)
    n = len(desc["steps"])
    if phase == 2:
        program = Program(desc, impl, folder, build=False)
        for s in desc["steps"][:k]:  # what phase 1 did to the model before its save
            if s["op"] == "to":
                program.dtype = DTYPES[s["dtype"]]
            if s["op"] in ("freeze", "unfreeze"):
                program.frozen_paths.append((s["path"], s["op"] == "unfreeze"))
        try:
            events.append({"op": "checkpoint", "i": k, **program.load_fresh(k, desc["steps"][k])})
        except BaseException as exc:  # noqa: BLE001
            return [{"op": "checkpoint", "i": k, "error": error_text(exc)}]
        first = k + 1
    else:
        try:
            program = Program(desc, impl, folder)
        except BaseException as exc:  # noqa: BLE001 - an error is an observation
            return [{"op": "wrap", "i": -1, "error": error_text(exc)}]
        events.append({"op": "wrap", "i": -1, "state": program.state("model")})  # the owner's: its own steps
        if k is not None:
            if _steps(program, desc, 0, k, events):
                try:
                    program.save(k)
                    events.append({"op": "save", "i": k})
                except BaseException as exc:  # noqa: BLE001
                    events.append({"op": "save", "i": k, "error": error_text(exc)})
            return events
        first = 0
    if _steps(program, desc, first, n, events):
        try:
            events.append({"op": "end", "i": n, "state": program.state("model"),
                           "optim_state": program.optim_state()})
        except BaseException as exc:  # noqa: BLE001
            events.append({"op": "end", "i": n, "error": error_text(exc)})
    return events
