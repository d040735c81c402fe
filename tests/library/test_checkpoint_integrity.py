"""Checkpoints that cannot load wrong: damaged files are named, a crashed save leaves the old checkpoint or
the new one (never a mix), and the training state (step, scheduler, RNG) travels inside the checkpoint.

Every damage and every crash point is tried on both designs (flat FSDP and per-parameter fully_shard); each
case must end in a clear error with the model and optimizer untouched, or in exactly the old or the new
values. What the checksums cost a save is measured by a benchmark run side by side, not here (no timed unit
tests)."""
import datetime
import json
import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import fsdp_mini.checkpoint.integrity as integrity
from fsdp_mini import FSDP, LaunchError, fully_shard, launch
from fsdp_mini.checkpoint.sharded_checkpoint import (EXTRA_STATE_PREFIX, CheckpointError, CorruptCheckpointError,
                                                     IncompleteCheckpointError, load_checkpoint, save_checkpoint, sharded_state_dict)
from fsdp_mini.checkpoint.integrity import MANIFEST, SaveStep, open_checkpoint, replaced_path, staging_path
from small_model import Block, TinyConfig, TinyLM, batch

pytestmark = pytest.mark.usefixtures("no_orphans")

CFG = TinyConfig()
BATCH = 4
TIMEOUT = 60
DESIGNS = ["flat", "per_param"]


def _model(design, seed=0):
    model = TinyLM(CFG, seed=seed)
    if design == "flat":
        return FSDP(model, sharding_strategy="FULL_SHARD", wrap=(Block,))
    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def _optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3)


def _train(model, opt, steps):
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    for s in steps:
        x, y = batch(CFG, BATCH, step=s)
        model(x[rows], y[rows]).backward()
        opt.step()
        opt.zero_grad()


def _full(model):
    """The whole model's values, gathered (the same on every rank): what a load must either fill exactly or
    leave as it was."""
    if isinstance(model, FSDP):
        return model.full_state_dict()
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}


def _equal(a, b):
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


# --- damage: every kind named, nothing loaded -----------------------------------------------------------

def _save_trained(path, design):
    model = _model(design)
    opt = _optimizer(model)
    _train(model, opt, range(2))
    save_checkpoint(path, model, opt, extra_state={"step": 2})
    return _full(model)


def _largest_piece(path, wanted):
    """(file, byte offset, length, key) of the largest piece whose key passes `wanted`."""
    body = json.loads(Path(path, MANIFEST).read_text())["body"]
    return max(((name, p["at"], p["bytes"], p["key"]) for name, f in body["files"].items() for p in f["pieces"]
                if wanted(p["key"])), key=lambda t: t[2])


def _flip(file, at, n=16):
    with open(file, "r+b") as f:
        f.seek(at)
        data = f.read(n)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data))


def _damage(src, dst):
    """Copies of the checkpoint `src` under `dst`, each with one kind of damage; what each must report."""
    cases = {}

    def copy(name):
        target = os.path.join(dst, name)
        shutil.copytree(src, target)
        return target

    copy("intact")
    cases["intact"] = None
    weight = _largest_piece(src, lambda k: not k.startswith(("optim.", "extra_state")))
    d = copy("data")
    _flip(os.path.join(d, weight[0]), weight[1] + weight[2] // 2)  # 16 bytes in the middle of a weight's piece
    cases["data"] = (CorruptCheckpointError, [weight[0], repr(weight[3]), "CRC-32", "nothing was loaded"])
    moment = _largest_piece(src, lambda k: k.startswith("optim.") and k.endswith(".exp_avg"))
    d = copy("optimizer")
    _flip(os.path.join(d, moment[0]), moment[1] + moment[2] // 2)
    cases["optimizer"] = (CorruptCheckpointError, [moment[0], repr(moment[3]), "CRC-32"])
    d = copy("metadata")
    _flip(os.path.join(d, ".metadata"), os.path.getsize(os.path.join(d, ".metadata")) // 2)
    cases["metadata"] = (CorruptCheckpointError, ["damaged", ".metadata", "CRC-32"])
    d = copy("manifest")  # still valid JSON, one recorded size changed: only the manifest's own checksum sees it
    text = Path(d, MANIFEST).read_text()
    size = json.loads(text)["body"]["files"][weight[0]]["size"]
    changed = text.replace(f'"size": {size}', f'"size": {size + 1}', 1)
    assert changed != text
    Path(d, MANIFEST).write_text(changed)
    cases["manifest"] = (CorruptCheckpointError, ["damaged", MANIFEST, "own checksum"])
    d = copy("deleted")
    os.remove(os.path.join(d, weight[0]))
    cases["deleted"] = (CorruptCheckpointError, [f"{weight[0]} is missing"])
    d = copy("truncated")
    file = os.path.join(d, weight[0])
    full = os.path.getsize(file)
    os.truncate(file, full // 2)
    cases["truncated"] = (CorruptCheckpointError, [f"{weight[0]} is {full // 2} bytes, the save wrote {full}",
                                                  "truncated"])
    d = copy("no_metadata")
    os.remove(os.path.join(d, ".metadata"))
    cases["no_metadata"] = (CorruptCheckpointError, [".metadata is missing"])
    d = copy("interrupted")  # what a crash before .metadata leaves when DCP writes in place
    os.remove(os.path.join(d, ".metadata"))
    os.remove(os.path.join(d, MANIFEST))
    cases["interrupted"] = (IncompleteCheckpointError, ["no complete checkpoint", "interrupted"])
    d = copy("no_manifest")
    os.remove(os.path.join(d, MANIFEST))
    cases["no_manifest"] = (CheckpointError, ["has no manifest.json", "cannot be verified", "verify=False"])
    return cases


def _try_loads(root, names, design):
    """Load every damaged copy into a fresh model and optimizer: the error (or None), whether both were left
    untouched, and the values loaded; then the checks that show what the checksums protect."""
    out = {}
    for name in names:
        model = _model(design, seed=1)
        opt = _optimizer(model)
        before = _full(model)
        try:
            extra = load_checkpoint(os.path.join(root, name), model, opt)
            error = None
        except Exception as exc:  # noqa: BLE001 - the test compares type and message
            extra, error = None, (type(exc), str(exc))
        out[name] = (error, _equal(before, _full(model)), len(opt.state) == 0, _full(model), extra)
    # Only what a load reads is verified: the model alone loads from the copy with a damaged optimizer state.
    model = _model(design, seed=1)
    load_checkpoint(os.path.join(root, "optimizer"), model)
    out["model only, damaged optimizer"] = (None, False, True, _full(model), None)
    # Without verification, the flipped bytes load silently as wrong values: what the checksums catch.
    model = _model(design, seed=1)
    try:
        load_checkpoint(os.path.join(root, "data"), model, verify=False)
        out["data, verify=False"] = (None, False, True, _full(model), None)
    except Exception as exc:  # noqa: BLE001 - a flip can also break the torch.save archive it lands in
        out["data, verify=False"] = ((type(exc), str(exc)), True, True, None, None)
    # A checkpoint without a manifest (plain dcp.save) loads with verify=False.
    model = _model(design, seed=1)
    extra = load_checkpoint(os.path.join(root, "no_manifest"), model, _optimizer(model), verify=False)
    out["no_manifest, verify=False"] = (None, False, False, _full(model), extra)
    return out


@pytest.mark.parametrize("design", DESIGNS)
def test_damage_is_named_before_anything_is_loaded(tmp_path, design):
    src = str(tmp_path / "ckpt")
    saved = launch(_save_trained, 2, args=(src, design), timeout=TIMEOUT)[0]
    cases = _damage(src, str(tmp_path / "copies"))
    results = launch(_try_loads, 2, args=(str(tmp_path / "copies"), list(cases), design), timeout=TIMEOUT)
    for rank_results in results:
        for name, expected in cases.items():
            error, untouched, opt_untouched, values, extra = rank_results[name]
            if expected is None:
                assert error is None, (name, error)
                assert _equal(values, saved) and extra == {"step": 2}, name
                continue
            assert error is not None, f"{name}: loaded without an error"
            cls, parts = expected
            assert issubclass(error[0], cls), (name, error)
            assert all(p in error[1] for p in parts), (name, parts, error[1])
            assert untouched and opt_untouched, f"{name}: the model or the optimizer was changed before the error"
        _, _, _, values, _ = rank_results["model only, damaged optimizer"]
        assert _equal(values, saved)
        error, _, _, values, _ = rank_results["data, verify=False"]
        assert error is not None or not _equal(values, saved), "the flip did not reach the weights: test nothing"
        _, _, _, values, extra = rank_results["no_manifest, verify=False"]
        assert _equal(values, saved) and extra == {"step": 2}


def test_opening_names_a_directory_that_holds_no_complete_checkpoint(tmp_path):
    # No collective: every rank reads these itself, so they fail before any.
    with pytest.raises(FileNotFoundError, match="no checkpoint directory at"):
        open_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IncompleteCheckpointError, match="no complete checkpoint .* no .metadata and no manifest.json"):
        open_checkpoint(tmp_path / "empty")
    staging = staging_path(tmp_path / "ckpt")
    staging.mkdir()
    (staging / "__0_0.distcp").write_bytes(b"partial")
    with pytest.raises(IncompleteCheckpointError, match="the save into it was interrupted before it committed"):
        open_checkpoint(tmp_path / "ckpt")
    with pytest.raises(IncompleteCheckpointError, match="no complete checkpoint"):
        open_checkpoint(staging)
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="no checkpoint directory at"):
        open_checkpoint(tmp_path / "file")
    # Damaged metadata without a manifest to check it against (verify=False): said so, not an UnpicklingError.
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / ".metadata").write_bytes(b"\x80\x04\x95garbage")
    with pytest.raises(CorruptCheckpointError, match="its .metadata cannot be read"):
        open_checkpoint(tmp_path / "plain", verify=False)
    with pytest.raises(CheckpointError, match="cannot be verified"):
        open_checkpoint(tmp_path / "plain")


# --- a crash at every point of an overwrite: the old checkpoint or the new one ---------------------------

CRASHING_RANK = {SaveStep.BEFORE_DATA: 1, SaveStep.AFTER_DATA: 1,  # the other rank goes on to its collectives
                 SaveStep.BEFORE_COMMIT: 0, SaveStep.BETWEEN_RENAMES: 0, SaveStep.BEFORE_CLEANUP: 0}  # rank 0's steps


def _old_and_new(path, design):
    """Save the old checkpoint (after one step); return the old values and the new ones (after two)."""
    model = _model(design)
    opt = _optimizer(model)
    _train(model, opt, range(1))
    save_checkpoint(path, model, opt, extra_state={"step": 1})
    old = _full(model)
    _train(model, opt, range(1, 2))
    return old, _full(model)


def _save_new(path, design):
    model = _model(design)
    opt = _optimizer(model)
    _train(model, opt, range(2))
    save_checkpoint(path, model, opt, overwrite=True, extra_state={"step": 2})


def _load_each(paths, design):
    out = []
    for path in paths:
        model = _model(design, seed=1)
        opt = _optimizer(model)
        try:
            extra = load_checkpoint(path, model, opt)
            out.append((None, _full(model), extra))
        except Exception as exc:  # noqa: BLE001 - the test reads type and message
            out.append(((type(exc), str(exc)), None, None))
    return out


def _save_new_and_load_each(paths, design):
    for path in paths:
        _save_new(path, design)
    return _load_each(paths, design)


@pytest.mark.parametrize("design", DESIGNS)
def test_a_crash_at_any_point_of_an_overwrite_leaves_the_old_or_the_new_checkpoint(tmp_path, monkeypatch, design):
    first = str(tmp_path / "first" / "ckpt")
    old, new = launch(_old_and_new, 2, args=(first, design), timeout=TIMEOUT)[0]
    assert not _equal(old, new)
    paths = {}
    for step in SaveStep:
        paths[step] = str(tmp_path / step.name / "ckpt")
        shutil.copytree(first, paths[step])

        def crash(reached, step=step):  # the forked ranks inherit this: a rank dies at once, no cleanup
            if reached is step and dist.get_rank() == CRASHING_RANK[step]:
                os._exit(17)

        monkeypatch.setattr(integrity, "_reached", crash)
        with pytest.raises(LaunchError, match="code 17"):
            launch(_save_new, 2, args=(paths[step], design), timeout=TIMEOUT)
        monkeypatch.undo()

    between = SaveStep.BETWEEN_RENAMES
    targets = list(paths.values()) + [str(replaced_path(paths[between]))]
    loaded = launch(_load_each, 2, args=(targets, design), timeout=TIMEOUT)
    for rank_loaded in loaded:
        by_step = dict(zip(SaveStep, rank_loaded))
        for step in (SaveStep.BEFORE_DATA, SaveStep.AFTER_DATA, SaveStep.BEFORE_COMMIT):
            error, values, extra = by_step[step]
            assert error is None and _equal(values, old) and extra == {"step": 1}, (step, error)
        error, _, _ = by_step[between]  # the target is absent: said so, with where the old one is
        assert issubclass(error[0], IncompleteCheckpointError), error
        assert "interrupted between its two renames" in error[1] and str(replaced_path(paths[between])) in error[1]
        error, values, extra = rank_loaded[-1]  # ... and the old one is whole there
        assert error is None and _equal(values, old) and extra == {"step": 1}, error
        error, values, extra = by_step[SaveStep.BEFORE_CLEANUP]
        assert error is None and _equal(values, new) and extra == {"step": 2}, error

    # The next save cleans up after the crashed one (and puts the old checkpoint back first) and commits.
    reloaded = launch(_save_new_and_load_each, 2, args=(list(paths.values()), design), timeout=TIMEOUT)
    for rank_loaded in reloaded:
        for step, (error, values, extra) in zip(SaveStep, rank_loaded):
            assert error is None and _equal(values, new) and extra == {"step": 2}, (step, error)
    for path in paths.values():
        assert not staging_path(path).exists() and not replaced_path(path).exists()
        assert sorted(os.listdir(os.path.dirname(path))) == ["ckpt"]


def _save_failing_on_one_rank(path, where):
    """Save, then save again over it while one rank fails: rank 1 cannot read back what it wrote (where=
    "checksum": DCP's write step fails there, and DCP reports that on every rank), or rank 0 cannot write the
    manifest (where="commit": rank 0 tells the others). Then load what is at `path`."""
    model = _model("flat")
    save_checkpoint(path, model, extra_state={"step": 1})
    name, failing_rank = {"checksum": ("_crc32s", 1), "commit": ("_write_manifest", 0)}[where]
    real = getattr(integrity, name)

    def failing(*args):
        if dist.get_rank() == failing_rank:
            raise OSError("injected failure")
        return real(*args)

    setattr(integrity, name, failing)
    try:
        save_checkpoint(path, model, overwrite=True, extra_state={"step": 2})
        error = None
    except Exception as exc:  # noqa: BLE001 - the test reads type and message
        error = (type(exc), str(exc))
    finally:
        setattr(integrity, name, real)
    return error, load_checkpoint(path, _model("flat", seed=1))


@pytest.mark.parametrize("where", ["checksum", "commit"])
def test_a_save_that_fails_on_one_rank_fails_on_every_rank_and_commits_nothing(tmp_path, where):
    results = launch(_save_failing_on_one_rank, 2, args=(str(tmp_path / "ckpt"), where), timeout=TIMEOUT)
    for rank, (error, extra) in enumerate(results):
        assert error is not None and "OSError: injected failure" in f"{error[0].__name__}: {error[1]}", (rank, error)
        if where == "commit" and rank == 1:
            assert issubclass(error[0], CheckpointError) and "failed on rank 0" in error[1], error
        assert extra == {"step": 1}  # the old checkpoint, untouched


# --- the training state travels in the checkpoint -------------------------------------------------------

def _save_training_state(path, design):
    model = _model(design)
    opt = _optimizer(model)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    torch.manual_seed(100 + dist.get_rank())  # a different RNG stream on each rank, as with per-rank dropout
    _train(model, opt, range(3))
    for _ in range(3):
        scheduler.step()
    state = {"step": 3, "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "rank": dist.get_rank()}
    save_checkpoint(path, model, opt, extra_state=state)
    return state, torch.rand(3), opt.param_groups[0]["lr"]  # what the RNG draws next, on this rank


def _resume_training_state(path, design):
    model = _model(design, seed=1)
    opt = _optimizer(model)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = load_checkpoint(path, model, opt)
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    return state["step"], state["rank"], scheduler.get_last_lr()[0], opt.param_groups[0]["lr"], torch.rand(3)


@pytest.mark.parametrize("design", DESIGNS)
def test_extra_state_round_trips_per_rank(tmp_path, design):
    path = str(tmp_path / "ckpt")
    saved = launch(_save_training_state, 2, args=(path, design), timeout=TIMEOUT)
    assert not torch.equal(saved[0][1], saved[1][1])  # the ranks' RNG streams differ: per-rank state is tested
    resumed = launch(_resume_training_state, 2, args=(path, design), timeout=TIMEOUT)
    for rank, ((state, draws, lr), (step, saved_by, last_lr, opt_lr, resumed_draws)) in enumerate(zip(saved, resumed)):
        assert (step, saved_by) == (3, rank)  # each rank gets back its own
        assert last_lr == lr == opt_lr == pytest.approx(1e-2 * 0.5 ** 3)
        assert torch.equal(resumed_draws, draws)  # the RNG goes on where it stopped
    if design == "flat":  # at another world size, every rank gets rank 0's
        for step, saved_by, _, _, draws in launch(_resume_training_state, 3, args=(path, design), timeout=TIMEOUT):
            assert (step, saved_by) == (3, 0) and torch.equal(draws, saved[0][1])


def _model_only_without_extra_state(path):
    model = _model("flat")
    save_checkpoint(path, model)
    return load_checkpoint(path, _model("flat", seed=1))


def test_a_checkpoint_without_extra_state_loads_an_empty_dict(tmp_path):
    assert launch(_model_only_without_extra_state, 2, args=(str(tmp_path / "ckpt"),), timeout=TIMEOUT) == [{}, {}]


# --- bad input: a clear error before any collective -----------------------------------------------------

def _bad_save_on_rank0(path, kwargs):
    """Only rank 0 calls save_checkpoint: had it entered a collective first, it would wait for rank 1 until
    the launch's timeout instead of raising."""
    model = _model("flat")  # on both ranks: wrapping checks, collectively, that they start from the same values
    if dist.get_rank() != 0:
        return None
    try:
        save_checkpoint(path, model, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the test reads type and message
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("setup, kwargs, error, message", [
    ("other_files", {}, FileExistsError, "holds files that are not a checkpoint's (notes.txt)"),
    ("other_files", {"overwrite": True}, FileExistsError, "holds files that are not a checkpoint's"),
    ("file", {}, FileExistsError, "is a file: a checkpoint is a directory"),
    ("checkpoint", {}, FileExistsError, "already exists"),
    ("empty", {"extra_state": [1, 2]}, TypeError, "extra_state must be a dict"),
    ("empty", {"extra_state": {"f": lambda: 0}}, TypeError, "extra_state cannot be saved"),
    # picklable, but not by torch.load(weights_only=True), the only way a load reads it: refused when saving
    ("empty", {"extra_state": {"when": datetime.date(2026, 1, 1)}}, TypeError,
     "extra_state would not load back: load_checkpoint reads pickled items with torch.load(weights_only=True)"),
])
def test_bad_input_to_save_is_refused_before_any_collective(tmp_path, setup, kwargs, error, message):
    path = tmp_path / "ckpt"
    if setup == "other_files":
        path.mkdir()
        (path / "notes.txt").write_text("mine")
    elif setup == "file":
        path.write_text("x")
    elif setup == "checkpoint":
        path.mkdir()
        (path / ".metadata").write_bytes(b"")
    elif setup == "empty":
        path.mkdir()
    result = launch(_bad_save_on_rank0, 2, args=(str(path), kwargs), timeout=30)[0]
    assert result is not None and issubclass(result[0], error) and message in result[1], result
    if setup == "other_files":
        assert os.listdir(path) == ["notes.txt"]  # nothing deleted, nothing written


def test_a_plain_dcp_checkpoint_reads_the_same_tensors(tmp_path):
    # The manifest sits beside DCP's files: the directory stays a plain DCP checkpoint.
    path = str(tmp_path / "ckpt")
    saved = launch(_save_trained, 2, args=(path, "flat"), timeout=TIMEOUT)[0]
    target = {k: torch.empty_like(v) for k, v in saved.items()}  # the tied head too: written under both names
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(target, checkpoint_id=path, no_dist=True)
    assert all(torch.equal(target[k], saved[k]) for k in target)
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp", "__1_0.distcp", MANIFEST]


# --- a checkpoint cannot run code -------------------------------------------------------------------------

class _RunsCode:
    """Pickled as the call open(marker, "w"): unpickling it creates the file `marker`. A crafted checkpoint
    could call anything instead (os.system, ...); a file is what a test can see."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _save_crafted(path, design, where, marker):
    """A checkpoint whose `.metadata` (where="metadata") or rank 1's extra_state (where="data") carries a
    pickle that creates `marker`, saved through save_atomically: its manifest matches every byte, as the
    manifest of a checkpoint from someone else's machine would. A CRC proves integrity, not origin."""
    from fsdp_mini.checkpoint.sharded_boxes import BoxesSavePlanner

    model = _model(design)
    opt = _optimizer(model)
    _train(model, opt, range(1))
    sd = sharded_state_dict(model, opt)
    rank = dist.get_rank()
    sd[f"{EXTRA_STATE_PREFIX}{rank}"] = {"step": _RunsCode(marker) if where == "data" and rank == 1 else 1}

    def write(writer):
        dcp.save(sd, storage_writer=writer, planner=BoxesSavePlanner())
        if where == "metadata" and rank == 0:
            file = Path(writer.path, ".metadata")
            metadata = pickle.loads(file.read_bytes())  # our own, just written
            metadata.planner_data = _RunsCode(marker)
            file.write_bytes(pickle.dumps(metadata))

    integrity.save_atomically(path, write, overwrite=False)


def _load_crafted(cases, design, marker):
    out = []
    for path, verify in cases:
        model = _model(design, seed=1)
        opt = _optimizer(model)
        before = _full(model)
        try:
            load_checkpoint(path, model, opt, verify=verify)
            error = None
        except Exception as exc:  # noqa: BLE001 - the test reads type and message
            error = (type(exc).__name__, str(exc))
        out.append((error, _equal(before, _full(model)), len(opt.state) == 0, os.path.exists(marker)))
    return out


@pytest.mark.parametrize("design", DESIGNS)
def test_a_checkpoint_whose_pickles_would_run_code_is_refused(tmp_path, design):
    marker = tmp_path / "code_ran"
    cases = []
    for where in ("metadata", "data"):
        path = tmp_path / where
        launch(_save_crafted, 2, args=(str(path), design, where, str(marker)), timeout=TIMEOUT)
        unverified = tmp_path / f"{where}_without_manifest"  # a plain dcp.save checkpoint: verify=False
        shutil.copytree(path, unverified)
        os.remove(unverified / MANIFEST)
        cases += [(str(path), True), (str(unverified), False)]
    assert not marker.exists()
    expected = {  # what each refusal must name: the file or the item, and the global
        str(tmp_path / "metadata"): [".metadata asks for the global io.open", "refused"],
        str(tmp_path / "data"): ["'extra_state/rank1' was refused by torch.load(weights_only=True)", "io.open"],
    }
    for rank_results in launch(_load_crafted, 2, args=(cases, design, str(marker)), timeout=TIMEOUT):
        for (path, verify), (error, untouched, opt_untouched, ran) in zip(cases, rank_results):
            assert not ran, f"{path}: the checkpoint ran code (error: {error})"
            parts = expected[path.replace("_without_manifest", "")]
            assert error is not None and error[0] == "UnsafeCheckpointError", (path, error)
            assert all(p in error[1] for p in parts), (path, parts, error)
            assert untouched and opt_untouched, f"{path}: the model or the optimizer was changed before the error"
    assert not marker.exists()
    # PyTorch's own DCP reader runs both: the difference from PyTorch that the docstrings state.
    dcp.FileSystemReader(str(tmp_path / "metadata")).read_metadata()
    assert marker.exists()
    marker.unlink()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load({f"{EXTRA_STATE_PREFIX}1": None}, checkpoint_id=str(tmp_path / "data"), no_dist=True)
    assert marker.exists()


def _save_with_pytorch(path):
    """PyTorch's own sharded checkpoint: FSDP2 and get_state_dict, saved as one nested dict by plain dcp.save
    (DCP flattens it, so its metadata also holds planner_data, the nesting)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    model = TinyLM(CFG)
    for block in model.blocks:
        torch_fully_shard(block)
    torch_fully_shard(model)
    opt = _optimizer(model)
    _train(model, opt, range(1))
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd, "extra": {"step": 1}}, checkpoint_id=path)


def test_the_restricted_unpickler_reads_pytorchs_own_checkpoints(tmp_path):
    # The allowlist is no narrower than what DCP writes: PyTorch's FSDP2 checkpoint's metadata reads as pickle does.
    path = tmp_path / "pytorch"
    launch(_save_with_pytorch, 2, args=(str(path),), timeout=TIMEOUT)
    opened = open_checkpoint(path, verify=False)  # no manifest: a plain dcp.save
    plain = pickle.loads((path / ".metadata").read_bytes())
    assert opened.metadata.planner_data and opened.metadata.planner_data == plain.planner_data
    assert opened.metadata.state_dict_metadata == plain.state_dict_metadata
    assert opened.metadata.storage_data == plain.storage_data
