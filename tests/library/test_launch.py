"""launch(): results in rank order, output grouped by rank, and the ways to fail, each fast; and what
`init()` / `finish()` do for a rank under torchrun (no orphan when the agent dies)."""
import datetime
import gc
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

import fsdp_mini
from fsdp_mini import LaunchError, LaunchTimeout, init, launch
from fsdp_mini import collectives as C
from fsdp_mini.flight_recorder import diagnose

pytestmark = pytest.mark.usefixtures("no_orphans")


def _rank_info(offset):
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(), "offset": offset,
            "env": {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                               "GROUP_RANK", "OMP_NUM_THREADS")},
            "threads": torch.get_num_threads()}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_results_in_rank_order(world_size):
    out = launch(_rank_info, world_size, args=(7,))
    assert [o["rank"] for o in out] == list(range(world_size))
    for o in out:
        assert o["world"] == world_size and o["offset"] == 7
        assert o["sum"] == sum(range(world_size))
        assert o["env"]["RANK"] == str(o["rank"]) and o["env"]["WORLD_SIZE"] == str(world_size)
        assert o["env"]["OMP_NUM_THREADS"] == "1" and o["threads"] == 1


def test_simulated_nodes_set_local_ranks():
    out = launch(_rank_info, 4, args=(0,), local_world_size=2)
    assert [(o["env"]["LOCAL_RANK"], o["env"]["GROUP_RANK"]) for o in out] == \
        [("0", "0"), ("1", "0"), ("0", "1"), ("1", "1")]
    assert {o["env"]["LOCAL_WORLD_SIZE"] for o in out} == {"2"}


def test_closure_and_output_grouped_by_rank(capsys):
    secret = {"x": 41}

    def talk():  # a closure: works because ranks are forked, nothing is pickled on the way in
        r = dist.get_rank()
        time.sleep(0.05 * (3 - r))  # ranks finish in reverse order; output must still be in rank order
        print(f"first line of {r}")
        print(f"second line of {r}")
        return secret["x"] + 1

    assert launch(talk, 3) == [42, 42, 42]
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"[rank {r}] {w} line of {r}" for r in range(3) for w in ("first", "second")]


def test_function_from_a_main_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist
        from fsdp_mini import launch

        def work(scale):  # lives in __main__: a spawn-based launcher could not find it
            t = torch.ones(3) * (dist.get_rank() + 1) * scale
            dist.all_reduce(t)
            return t.tolist()

        if __name__ == "__main__":
            print("RESULT", launch(work, 2, args=(10,)))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "RESULT [[30.0, 30.0, 30.0], [30.0, 30.0, 30.0]]" in proc.stdout


def _raise_on_rank_2():
    if dist.get_rank() == 2:
        raise KeyError("a very particular problem")
    dist.all_reduce(torch.zeros(1))


def test_a_raising_rank_is_reported_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(_raise_on_rank_2, 4, timeout=50)
    assert time.monotonic() - start < 10
    err = info.value
    assert err.rank == 2 and not isinstance(err, LaunchTimeout)
    assert "rank 2 failed: KeyError: 'a very particular problem'" in str(err)
    assert 'raise KeyError("a very particular problem")' in err.remote_traceback


def _skip_a_collective():
    if dist.get_rank() != 1:
        dist.all_reduce(torch.zeros(1))
    return dist.get_rank()


def test_ranks_that_disagree_on_collectives_time_out_with_their_stacks():
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(_skip_a_collective, 3, timeout=3)
    elapsed = time.monotonic() - start
    assert 3 <= elapsed < 15
    msg = str(info.value)
    assert "ranks [0, 2] did not finish within 3 s (ranks [1] returned)" in msg
    assert "in _skip_a_collective" in msg and "in all_reduce" in msg  # where each rank waits


def _die_silently():
    if dist.get_rank() == 1:
        os._exit(7)
    dist.all_reduce(torch.zeros(1))


def test_a_rank_that_dies_without_reporting_is_named():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(_die_silently, 2, timeout=50)
    assert time.monotonic() - start < 10
    assert str(info.value).splitlines()[0] == "rank 1 exited with code 7 without reporting (os._exit?)"
    assert info.value.rank == 1


def _killed_after_one_collective():
    C.all_reduce(torch.ones(2))
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    C.all_reduce(torch.ones(2))


def test_a_killed_rank_is_said_first_and_the_verdict_follows():
    with pytest.raises(LaunchError) as info:
        launch(_killed_after_one_collective, 2, timeout=50)
    verdict = "ranks diverged: rank 0 waits in AllReduce #2 while rank 1 issued no collective #2 (its last: AllReduce #1)"
    assert str(info.value).splitlines()[:2] == ["rank 1 was killed by signal 9 (SIGKILL)", verdict]
    assert info.value.rank == 1 and info.value.verdict == verdict


def _crashes_while_its_peer_gathers_a_dtensor():
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    sharded = distribute_tensor(torch.ones(4), init_device_mesh("cpu", (2,)), [Shard(0)])
    if dist.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGSEGV)  # a crash in native code
    sharded.full_tensor()  # rank 1: an AllGather through functional collectives, whose peer is gone


def test_a_crashed_rank_is_the_cause_when_its_peer_fails_inside_a_functional_collective():
    # Rank 1's error ("Connection reset/closed by peer") comes from gloo through torch/_ops.py, not from a
    # frame of torch.distributed: it is still the consequence, and the crashed rank is named first.
    with pytest.raises(LaunchError) as info:
        launch(_crashes_while_its_peer_gathers_a_dtensor, 2, timeout=50)
    assert str(info.value).splitlines()[0] == "rank 0 was killed by signal 11 (SIGSEGV)", str(info.value)
    assert info.value.rank == 0 and "(ranks [1] failed after it" in str(info.value)


def _ends_with_finish(code):
    rank, world = fsdp_mini.init()  # already initialised by launch: only returns the rank
    t = torch.ones(3) * (rank + 1)
    C.all_reduce(t)
    print(f"rank {rank}/{world} sum {t.tolist()}")
    fsdp_mini.finish(code if rank == 1 else 0)
    print("never printed: finish() does not return")


def test_a_worker_that_ends_with_finish_works_under_launch(capsys):
    """The torchrun shape (init() first, finish() last) runs unchanged under launch: the rank's result is None."""
    assert launch(_ends_with_finish, 2, args=(0,)) == [None, None]
    assert capsys.readouterr().out.splitlines() == ["[rank 0] rank 0/2 sum [3.0, 3.0, 3.0]",
                                                    "[rank 1] rank 1/2 sum [3.0, 3.0, 3.0]"]
    with pytest.raises(LaunchError) as info:
        launch(_ends_with_finish, 2, args=(3,))
    assert str(info.value).splitlines()[0] == "rank 1 exited with code 3 (fsdp_mini.finish or sys.exit)"


def test_init_rejects_a_bad_timeout_before_anything_starts():
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, got 0"):
        init(timeout=0)
    assert not dist.is_initialized()


def _init_as_env_rank(rank, env, late_s, conn):
    """A forked rank of a world of two that finds torchrun's variables and reaches `init` `late_s` seconds late."""
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
    time.sleep(late_s)
    try:
        init(timeout=1)
        t = torch.ones(1)
        dist.all_reduce(t)
        conn.send(t.item())
    except RuntimeError as e:
        conn.send(str(e))
    os._exit(0)


def _world_of_env_ranks(tmp_path, lateness, agent_store, heard=(0, 1)):
    """Run `_init_as_env_rank` for each rank's lateness; what the ranks `heard` sent. With `agent_store`, the
    store is this process's, as torchrun's agent hosts it for its ranks; else rank 0 hosts it (plain env://)."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False) if agent_store else None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = store.port if agent_store else s.getsockname()[1]
    env = dict(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               FSDP_MINI_FLIGHT_DIR=str(tmp_path), TORCHELASTIC_USE_AGENT_STORE=str(agent_store))
    ctx = multiprocessing.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in lateness]
    procs = [ctx.Process(target=_init_as_env_rank, args=(rank, env, late, pipes[rank][1]))
             for rank, late in enumerate(lateness)]
    for proc in procs:
        proc.start()
    try:
        readers = [pipes[rank][0] for rank in heard]
        return [reader.recv() if reader.poll(60) else "nothing within 60 s" for reader in readers]
    finally:
        for proc in procs:
            proc.kill()
            proc.join()


@pytest.mark.parametrize("agent_store", [False, True], ids=["rank0-store", "torchrun-agent-store"])
def test_init_waits_for_a_rank_that_starts_later_than_the_timeout(tmp_path, monkeypatch, agent_store):
    """`timeout` is for hangs: a peer that reaches `init` 2 s late under timeout=1 is a slow start (torch's
    `init_process_group(timeout=1)` fails it). A peer that never comes fails after STARTUP_TIMEOUT, named."""
    assert _world_of_env_ranks(tmp_path, [0, 2], agent_store) == [2.0, 2.0]
    monkeypatch.setattr(fsdp_mini.runtime, "STARTUP_TIMEOUT", datetime.timedelta(seconds=2))
    [alone] = _world_of_env_ranks(tmp_path, [0, 60], agent_store, heard=[0])
    assert alone.startswith("rank 0: not all 2 ranks reached fsdp_mini.init() within 2 s; "
                            "the others did not start or failed before it (")


ABORTS = """
import faulthandler, os, sys
faulthandler.enable(file=os.dup(2))  # as pytest does: a copy of the caller's stderr, taken before the fork
import torch, torch.distributed as dist
from fsdp_mini import LaunchError, launch


def abort_on_rank_1():
    if dist.get_rank() == 1:
        os.abort()  # as gloo does on mismatched sizes
    dist.barrier()


try:
    launch(abort_on_rank_1, 2, timeout=60)
except LaunchError as error:
    print(error)
"""


def test_an_aborting_rank_prints_no_fatal_error_in_the_caller_and_its_dump_is_in_the_error(tmp_path):
    """Under `make test` the broken exercise solutions' ranks that abort printed "Fatal Python error:
    Aborted" and every thread's stack into the terminal (pytest's faulthandler, inherited by the fork).
    The dump goes to the rank's log now, and from there into the error that names the rank."""
    script = tmp_path / "aborts.py"
    script.write_text(ABORTS)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr
    assert "Fatal Python error" not in out.stderr, out.stderr
    assert out.stdout.startswith("rank 1 was killed by signal 6 (SIGABRT)\n"), out.stdout
    assert "--- last lines of rank 1's stderr ---\nFatal Python error: Aborted" in out.stdout  # not hidden


def _unpicklable():
    return threading.Lock()


def test_unpicklable_result_is_a_clear_error():
    with pytest.raises(LaunchError, match="return value of rank 0 cannot be pickled"):
        launch(_unpicklable, 1)


@pytest.mark.parametrize("kwargs, match", [
    ({"world_size": 0}, "world_size must be an integer >= 1"),
    ({"world_size": 2.0}, "world_size must be an integer >= 1"),
    ({"fn": 3}, "fn must be callable"),
    ({"backend": "mpi"}, "unknown backend 'mpi'"),
    ({"timeout": 0}, "timeout must be a positive number"),
    ({"world_size": 4, "local_world_size": 3}, r"local_world_size \(3\) must be >= 1 and divide world_size"),
    ({"args": 5}, "args must be a tuple"),
])
def test_bad_arguments_raise_before_any_process_starts(kwargs, match, monkeypatch):
    import multiprocessing.context

    def no_start(self):  # any attempt to start a rank fails the test
        raise AssertionError("a process was started")
    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", no_start)
    call = {"fn": _rank_info, "world_size": 2, "args": (0,)} | kwargs
    with pytest.raises(ValueError, match=match):
        launch(**call)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has GPUs")
def test_nccl_without_enough_gpus_is_a_value_error():
    with pytest.raises(ValueError, match="backend 'nccl' needs 2 GPUs"):
        launch(_rank_info, 2, args=(0,), backend="nccl")


def test_launches_in_parallel_do_not_collide():
    results, errors = {}, []

    def run(i):
        try:
            results[i] = launch(_rank_info, 2, args=(i,))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert {i: [o["offset"] for o in out] for i, out in results.items()} == {0: [0, 0], 1: [1, 1], 2: [2, 2]}


def test_ranks_start_with_the_callers_objects_frozen_and_the_caller_gets_them_back():
    """`frozen_heap`: the ranks inherit the caller's objects frozen (their full collections skip them),
    and the caller's own state is as before, whether it had frozen nothing or frozen objects itself."""
    assert gc.get_freeze_count() == 0, "this test needs a caller that froze nothing"
    try:
        in_ranks = launch(gc.get_freeze_count, 2)
        assert gc.get_freeze_count() == 0
        assert min(in_ranks) > 10_000  # torch's objects alone are more
        gc.freeze()  # a caller that froze its objects itself
        frozen = gc.get_freeze_count()
        assert min(launch(gc.get_freeze_count, 2)) > frozen // 2  # frozen there too (a rank frees a few)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_init_inside_launch_returns_the_rank():
    assert launch(init, 2) == [(0, 2), (1, 2)]


WORKER = """
import torch, torch.distributed as dist
import fsdp_mini
rank, world = fsdp_mini.init()
t = torch.ones(5) * (rank + 1)
fsdp_mini.collectives.ring_all_reduce(t)
print(f"rank {rank}/{world} local {__import__('os').environ['LOCAL_RANK']} sum {t.tolist()}")
fsdp_mini.finish(int(__import__('os').environ.get("EXIT_CODE", "0")))
print("never printed: finish() does not return")
"""


@pytest.mark.torchrun
def test_same_worker_runs_under_torchrun_and_as_a_plain_script(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))  # the flight records go there
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert plain.returncode == 0, plain.stderr
    assert "rank 0/1 local 0 sum [1.0, 1.0, 1.0, 1.0, 1.0]" in plain.stdout
    tr = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert tr.returncode == 0, tr.stderr
    for r in range(2):
        assert f"rank {r}/2 local {r} sum [3.0, 3.0, 3.0, 3.0, 3.0]" in tr.stdout
    assert "never printed" not in plain.stdout + tr.stdout


def test_finish_flushes_the_output_and_exits_with_the_code(tmp_path):
    """Output piped to a file is block-buffered: without the flush in `finish`, os._exit would lose it."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", EXIT_CODE="3")
    env.pop("PYTHONUNBUFFERED", None)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 3, out.stderr
    assert out.stdout == "rank 0/1 local 0 sum [1.0, 1.0, 1.0, 1.0, 1.0]\n"


FOREVER = """
import os, sys, time
import torch
import fsdp_mini
from fsdp_mini import collectives as C

rank, world = fsdp_mini.init(timeout=60)
with open(os.path.join(sys.argv[1], f"pid.{rank}"), "w") as f:
    f.write(str(os.getpid()))
while True:  # training that never ends by itself
    C.all_reduce(torch.ones(4))
    time.sleep(0.05)
"""


@pytest.mark.torchrun
def test_killing_the_torchrun_agent_leaves_no_rank_running_and_diagnose_calls_the_run_interrupted(tmp_path):
    """torchrun starts each rank in a session of its own, so a killed agent (SIGKILL: no clean-up) used to
    leave its ranks training; `init()` asks Linux to kill a rank when its parent dies, as `launch` does.
    The ranks' records then stop wherever each one was, with no end record: `diagnose` called that a
    divergence; it is an interrupted run."""
    script = tmp_path / "forever.py"
    script.write_text(FOREVER)
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              str(script), str(tmp_path)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids = []
    try:
        deadline = time.monotonic() + 120
        while len(pids) < 2 and time.monotonic() < deadline and agent.poll() is None:
            time.sleep(0.2)
            pids = [int(p.read_text()) for p in tmp_path.glob("pid.*") if p.read_text()]
        assert len(pids) == 2, "the ranks did not start"
        ranks = [psutil.Process(pid) for pid in pids]
        agent.kill()
        agent.wait(30)
        gone, alive = psutil.wait_procs(ranks, timeout=15)
        alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"ranks still running after their agent was killed: {alive}"
        [folder] = (tmp_path / "fsdp_mini_flight").iterdir()
        assert diagnose(str(folder)).splitlines() == [
            "the run was interrupted: no rank left an end record (ranks 0, 1; killed together, e.g. with their agent?)"]
    finally:
        agent.kill()
        agent.wait(30)
        for pid in pids:  # never leave one behind, whatever the test found
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
