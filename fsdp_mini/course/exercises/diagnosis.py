"""Lesson 10's exercises: diagnosing ranks that went different ways, and a loop that cannot.

1. `first_divergence(records)`: given every rank's flight record (`fsdp_mini.flight_recorder.Entry`
   lists), the rank that went its own way and the sequence number where it did. Judged on records of
   real runs: the judge launches ranks that issue a training step's pattern of collectives with one
   planted failure each (a unit skipped, a tensor not padded, a step fewer, a collective on rank 0 only,
   subgroups that legitimately issue different numbers of collectives), the odd rank and the place drawn
   from a fixed seed, then two hand-made ties (between the two ranks of a pair; between two groups at the
   same number); the expected answer is read from the library's own verdict (`find_divergence`), whose
   tie rules the lesson states.
2. `hidden(model, idx)`: a forward with data-dependent control flow (a block for rows that hold a rare
   token) rewritten so that every rank issues the same collectives. Judged on 2, 3 and 4 real ranks under
   a short timeout, where some ranks hold no rare row: no hang, and the losses of two SGD steps equal one
   process's on the whole batch, computed row by row.
"""
from __future__ import annotations

import datetime
import functools
import os
import random
import re
import shutil
import tempfile
from collections import Counter

import torch
import torch.distributed as dist

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import in_forward, scope
from fsdp_mini.flight_recorder import RECORDER, Entry, find_divergence, load_run, record_path
from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP
from fsdp_mini.run import LaunchError, launch
from fsdp_mini.course.exercise import CodeExercise, NotYet, Verdict
from fsdp_mini.course.language import num, tr
from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.course.train import local_rows

__all__ = ["FIRST_DIVERGENCE", "SAME_COLLECTIVES", "first_divergence", "hidden", "RARE", "GatedGPT",
           "SCENARIOS", "recorded_runs", "library_verdict"]

# --- exercise 1: the first divergence ------------------------------------------------------------------

WORLD = 4
UNITS = 3
STEPS = 3
_GROUP_TIMEOUT_S = 1.5  # a collective that a peer never joins fails after this long (per-group timeout)
SEED = 10


def first_divergence(records: dict[int, list[Entry]]) -> tuple[int, int] | None:
    found = []
    groups = {e.group for entries in records.values() for e in entries}
    for group in groups:
        by_seq = {r: {e.seq: e for e in records.get(r, []) if e.group == group} for r in group}
        newest = max(max(entries, default=0) for entries in by_seq.values())
        # per group: its members must agree on each sequence number
        for seq in range(1, newest + 1):
            what = {r: by_seq[r][seq].signature() if seq in by_seq[r] else None for r in group}
            counts = Counter(what.values())
            if len(counts) > 1:
                # the rank the fewest agree with; on a tie, one that issued something, then the lowest
                odd = min(group, key=lambda r: (counts[what[r]], what[r] is None, r))
                found.append((seq, -len(group), odd))
                break
    if not found:
        return None
    seq, _, rank = min(found)  # the lowest number; on a tie, the larger group, then the lower rank
    return rank, seq


def _divergence_ties_by_rank(records):
    """Right on every recorded run, but breaks ties by the lowest rank alone: between ranks it may name
    one that issued nothing, across groups it may pick the smaller group's divergence."""
    found = []
    for group in {e.group for entries in records.values() for e in entries}:
        by_seq = {r: {e.seq: e for e in records.get(r, []) if e.group == group} for r in group}
        for seq in range(1, max(max(s, default=0) for s in by_seq.values()) + 1):
            what = {r: by_seq[r][seq].signature() if seq in by_seq[r] else None for r in group}
            counts = Counter(what.values())
            if len(counts) > 1:
                found.append((seq, min(group, key=lambda r: (counts[what[r]], r))))
                break
    return (min(found)[1], min(found)[0]) if found else None


def _divergence_by_op_only(records):
    """Compares the ops, not what they carry: a skipped unit of the same shape, an unpadded tensor pass."""
    found = []
    for group in {e.group for entries in records.values() for e in entries}:
        by_seq = {r: {e.seq: e.op for e in records.get(r, []) if e.group == group} for r in group}
        for seq in range(1, max(max(s, default=0) for s in by_seq.values()) + 1):
            what = {r: by_seq[r].get(seq) for r in group}
            counts = Counter(what.values())
            if len(counts) > 1:
                found.append((seq, min(group, key=lambda r: (counts[what[r]], r))))
                break
    return (min(found)[1], min(found)[0]) if found else None


def _divergence_by_list_index(records):
    """Lines the ranks' records up by position: wrong as soon as ranks issue collectives in different groups."""
    ranks = sorted(records)
    for i in range(max(len(records[r]) for r in ranks)):
        what = {r: records[r][i].signature() if i < len(records[r]) else None for r in ranks}
        counts = Counter(what.values())
        if len(counts) > 1:
            odd = min(ranks, key=lambda r: (counts[what[r]], r))
            entry = records[odd][i] if i < len(records[odd]) else records[ranks[0]][i]
            return odd, entry.seq
    return None


def _divergence_against_rank0(records):
    """Takes rank 0 as the truth: when rank 0 is the one that went its own way, it blames another rank."""
    found = []
    for group in {e.group for entries in records.values() for e in entries}:
        by_seq = {r: {e.seq: e.signature() for e in records.get(r, []) if e.group == group} for r in group}
        first = group[0]
        for seq in range(1, max(max(s, default=0) for s in by_seq.values()) + 1):
            other = [r for r in group if by_seq[r].get(seq) != by_seq[first].get(seq)]
            if other:
                found.append((seq, other[0]))
                break
    return (min(found)[1], min(found)[0]) if found else None


def _step(world, odd, skip_unit=None):
    """One training step's collectives: an AllGather per unit in forward, a ReduceScatter per unit in
    backward (reverse order), as FSDP issues them; `skip_unit` is skipped on rank `odd` only."""
    rank = dist.get_rank()
    in_forward(True)
    for u in range(UNITS):
        if not (rank == odd and u == skip_unit):
            with scope(f"blocks.{u}"):
                C.all_gather_into_tensor(torch.empty(6 * WORLD), torch.ones(6), group=world)
    in_forward(False)
    for u in reversed(range(UNITS)):
        with scope(f"blocks.{u}"):
            C.reduce_scatter_tensor(torch.empty(6), torch.ones(6 * WORLD), group=world)


def _healthy(world, pair, odd, k):
    for _ in range(STEPS):
        _step(world, odd)


def _skipped_unit(world, pair, odd, k):
    for step in range(STEPS):
        _step(world, odd, skip_unit=k if step == 1 else None)


def _unpadded(world, pair, odd, k):
    for i in range(5):
        C.all_reduce(torch.ones(7 if (dist.get_rank() == odd and i == k) else 8), group=world)


def _step_fewer(world, pair, odd, k):
    for _ in range(STEPS - (dist.get_rank() == odd)):
        _step(world, odd)


def _rank0_only(world, pair, odd, k):
    for step in range(STEPS):
        _step(world, odd)
        if dist.get_rank() == 0 and step == k:  # e.g. state_dict() behind `if rank == 0`
            with scope("full_state_dict"):
                C.all_gather_into_tensor(torch.empty(10 * WORLD), torch.ones(10), group=world)


def _subgroups(world, pair, odd, k):
    rank = dist.get_rank()
    syncs = 2 if rank < 2 else 1  # ranks 0, 1 sync twice in their pair, ranks 2, 3 once: both agree within
    for step in range(STEPS):
        for _ in range(syncs):
            C.all_reduce(torch.ones(3), group=pair)
        if not (rank == odd and step == STEPS - 1):
            C.all_reduce(torch.ones(5), group=world)


# name -> (what happened, in both languages; the function each rank runs; the choices of (odd, k))
SCENARIOS = {
    "agree": (("two ranks that agree", "два согласных ранга"), None, ((), ())),
    "tie in a pair": (("two ranks tie: one issued #2, the other nothing", "ничья двух рангов: один выдал #2, "
                       "другой ничего"), None, ((), ())),
    "tie across groups": (("a pair and the world diverge at the same number", "пара и все ранги расходятся на "
                           "одном номере"), None, ((), ())),
    "healthy": (("every rank the same", "все ранги одинаково"), _healthy, (range(WORLD), [0])),
    "skipped unit": (("a unit skipped on one rank", "юнит пропущен на одном ранге"), _skipped_unit,
                     (range(WORLD), range(UNITS))),
    "unpadded": (("a tensor not padded on one rank", "тензор без паддинга на одном ранге"), _unpadded,
                 (range(WORLD), range(5))),
    "step fewer": (("one rank has a step fewer", "у одного ранга на шаг меньше"), _step_fewer, (range(WORLD), [0])),
    "rank 0 only": (("a collective on rank 0 only", "коллективная операция только на ранге 0"), _rank0_only,
                    ([0], range(STEPS))),
    "subgroups": (("pairs sync differently, one rank skips", "пары синхронизируются по-разному, один ранг пропускает"),
                  _subgroups, (range(WORLD), [0])),
}


def _record_all(plan, folder):
    """On each rank: make every scenario's groups up front (with a short timeout, so that a collective a
    peer never joins fails instead of hanging), then run each scenario in turn, its record mirrored into
    its own subfolder, stopping quietly when a collective times out (a peer went elsewhere)."""
    rank = dist.get_rank()
    timeout = datetime.timedelta(seconds=_GROUP_TIMEOUT_S)
    groups = [(dist.new_group(list(range(WORLD)), timeout=timeout),
               [dist.new_group([0, 1], timeout=timeout), dist.new_group([2, 3], timeout=timeout)]) for _ in plan]
    for (name, odd, k), (world, pairs) in zip(plan, groups):
        dist.barrier()  # on the default group (long timeout): every scenario starts together
        RECORDER.reset()
        RECORDER.attach(record_path(os.path.join(folder, name), rank))
        try:
            SCENARIOS[name][1](world, pairs[rank // 2], odd, k)
        except RuntimeError:
            pass
        in_forward(False)
    return True


@functools.lru_cache(maxsize=None)
def recorded_runs(seed: int = SEED) -> tuple[tuple[str, dict[int, list[Entry]]], ...]:
    """Every scenario run once on `WORLD` real ranks, the odd rank and the place drawn from `seed`:
    (name, {rank: entries}) each. Cached: the runs do not depend on the learner's function."""
    rng = random.Random(seed)
    plan = []
    for name, (_, _, (ranks, places)) in SCENARIOS.items():
        if not ranks:  # hand-made, not run
            continue
        plan.append((name, rng.choice(list(ranks)), rng.choice(list(places))))
    folder = tempfile.mkdtemp(prefix="fsdp_mini_diagnosis_")
    try:
        for name, _, _ in plan:
            os.makedirs(os.path.join(folder, name))
        try:
            launch(_record_all, WORLD, args=(plan, folder), timeout=60)
        except LaunchError:  # a rank that failed harder than a timeout: its files still hold its record
            pass
        return tuple((name, load_run(os.path.join(folder, name)).records) for name, _, _ in plan)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def library_verdict(records: dict[int, list[Entry]]) -> tuple[int, int] | None:
    """(rank, seq) read from the library's own sentence: the odd rank comes first, then its #seq."""
    sentence = find_divergence(records, world=max(records) + 1)
    if sentence is None:
        return None
    match = re.match(r"rank (\d+) .*?#(\d+)", sentence)
    return int(match.group(1)), int(match.group(2))


def _probe() -> dict[int, list[Entry]]:
    """Two ranks that agree on one AllReduce: judged first, before any run is recorded (an unwritten body
    answers "not yet" at once)."""
    entry = Entry(1, "all_reduce", (0, 1), ((4,),), "float32", "", "", True)
    return {0: [entry], 1: [entry]}


def _tie_in_a_pair() -> dict[int, list[Entry]]:
    """Two ranks, one collective in common; then rank 1 issues a second one that rank 0 never issues:
    one rank on each side of the tie, and the rank to name is the one that issued something."""
    first = Entry(1, "all_reduce", (0, 1), ((4,),), "float32", "", "", True)
    return {0: [first], 1: [first, Entry(2, "all_gather", (0, 1), ((8,),), "float32", "blocks.0", "forward")]}


def _tie_across_groups() -> dict[int, list[Entry]]:
    """Both the pair (0, 1) and the whole world diverge at #2: the world's divergence (rank 3 gathers
    another unit) is the one to report, not the pair's (rank 1 issued nothing)."""
    world, pair = (0, 1, 2, 3), (0, 1)

    def gather(seq, unit):
        return Entry(seq, "all_gather", world, ((8,),), "float32", unit, "forward", True)

    def sync(seq):
        return Entry(seq, "all_reduce", pair, ((1,),), "float32", "", "", True)

    records = {r: [gather(1, "blocks.0"), gather(2, "blocks.3" if r == 3 else "blocks.1")] for r in world}
    records[0] += [sync(1), sync(2)]
    records[1] += [sync(1)]
    return records


# hand-made records judged after the recorded runs: (name, records, what to check when only the rank is wrong)
TIES = (
    ("tie in a pair", _tie_in_a_pair,
     ("the counts tie there (one rank each way): name the rank that issued a collective, not the one that "
      "issued none",
      "там ничья (по одному рангу с каждой стороны): назовите ранг, который выдал операцию, а не тот, что "
      "не выдал ничего")),
    ("tie across groups", _tie_across_groups,
     ("two groups diverge at the same number: report the divergence in the larger group",
      "две группы расходятся на одном номере: сообщите о расхождении в большей группе")),
)


def _runs_to_judge():
    """(name, records) in the order they are judged: the probe, then the recorded runs (recorded only once
    the probe is judged, so that an unwritten body answers "not yet" without waiting for them), then the ties."""
    yield "agree", _probe()
    yield from recorded_runs()
    for name, make, _ in TIES:
        yield name, make()


def _judge_divergence(fn) -> Verdict:
    hints = {name: hint for name, _, hint in TIES}
    for name, records in _runs_to_judge():
        label = tr(SCENARIOS[name][0][0], SCENARIOS[name][0][1])
        expected = library_verdict(records)
        got = fn({r: list(es) for r, es in records.items()})
        if got is not None and not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(x, int) for x in got)):
            return Verdict.wrong(tr(f"return (rank, seq) as a tuple of two ints, or None (got {got!r})",
                                    f"верните (rank, seq), кортеж из двух int, или None (получено {got!r})"))
        if got == expected:
            continue
        run = tr(f"in the run '{label}'", f"в прогоне «{label}»")
        if expected is None:
            return Verdict.wrong(tr(f"{run} all ranks issued the same collectives, yet you report {got}",
                                    f"{run} все ранги выдали одни и те же коллективные операции, а вы сообщаете {got}"))
        if got is None:
            return Verdict.wrong(tr(f"{run} the ranks do go different ways, and you found no divergence",
                                    f"{run} ранги действительно расходятся, а вы не нашли расхождения"))
        rank, seq = got
        if seq > expected[1]:
            return Verdict.wrong(tr(f"{run} the ranks of some group already disagree before #{seq}",
                                    f"{run} ранги какой-то группы расходятся уже до #{seq}"))
        if seq < expected[1]:
            return Verdict.wrong(tr(f"{run} at #{seq} the members of every group issued the same collective "
                                    "(compare entries with the same sequence number in the same group)",
                                    f"{run} на #{seq} все участники каждой группы выдали одну и ту же коллективную "
                                    "операцию (сравнивайте записи с одним номером в одной группе)"))
        hint = tr(f": {hints[name][0]}", f": {hints[name][1]}") if name in hints else ""
        return Verdict.wrong(tr(f"{run} the place #{seq} is right, but rank {rank} is not the one that went its own way"
                                + hint,
                                f"{run} место #{seq} верное, но ранг {rank} не тот, что пошёл своим путём" + hint))
    return Verdict.right(tr(f"({num(len(recorded_runs()))} recorded runs on {WORLD} ranks and "
                            f"{num(len(TIES))} hand-made ties)",
                            f"({num(len(recorded_runs()))} записанных прогонов на {WORLD} рангах и "
                            f"{num(len(TIES))} ничьи, составленные вручную)"))


FIRST_DIVERGENCE = CodeExercise("10.first_divergence", _judge_divergence, first_divergence,
                                (_divergence_by_op_only, _divergence_by_list_index, _divergence_against_rank0,
                                 _divergence_ties_by_rank))


# --- exercise 2: the same collectives on every rank ----------------------------------------------------

RARE = 55  # token ids >= RARE are "rare": a row that holds one goes through the last block
CFG = GPTConfig(n_layer=3)
WORLDS = (2, 3, 4)
ROWS = 12  # global batch: 6, 4, 3 rows per rank at worlds 2, 3, 4
_STEPS = 2
_TIMEOUT_S = 10


def hidden(model, idx):
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[1]))
    for block in model.blocks[:-1]:
        x = block(x)
    rare = (idx >= RARE).any(dim=1)  # rows that hold a rare token
    y = model.blocks[-1](x)  # on every rank, every step: its AllGather is issued everywhere
    return torch.where(rare[:, None, None], y, x)  # the mask decides, not an `if`


def _hidden_if_any(model, idx):
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[1]))
    for block in model.blocks[:-1]:
        x = block(x)
    rare = (idx >= RARE).any(dim=1)
    if rare.any():  # only ranks holding a rare row gather the last block: the others never join
        x = torch.where(rare[:, None, None], model.blocks[-1](x), x)
    return x


def _hidden_no_mask(model, idx):
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[1]))
    for block in model.blocks:  # no hang, but every row goes through the last block
        x = block(x)
    return x


def _hidden_mask_by_position(model, idx):
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(idx.shape[1]))
    for block in model.blocks[:-1]:
        x = block(x)
    rare = idx >= RARE  # per position, not per row: only the rare tokens themselves change
    return torch.where(rare[:, :, None], model.blocks[-1](x), x)


class GatedGPT(GPT):
    """The course GPT whose `hidden` is a function given from outside (the learner's)."""

    route = None

    def hidden(self, idx):
        return type(self).route(self, idx)


def gated_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step: no rare token except in one row of the first rows (step 0) or the
    last rows (step 1), so that at every world size some ranks hold no rare row."""
    x, y = make_batch(CFG, ROWS, step)
    x = x % RARE
    x[1 if step % 2 == 0 else ROWS - 1, 3] = RARE + 2
    return x, y


def _train_gated(fn):
    rank, world = dist.get_rank(), dist.get_world_size()
    GatedGPT.route = staticmethod(fn)
    model = FSDP(GatedGPT(CFG), "FULL_SHARD", wrap=(Block,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(_STEPS):
        x, y = (local_rows(t, rank, world) for t in gated_batch(step))
        try:
            loss = model(x, y)
        except NotImplementedError:
            raise NotYet() from None
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _one_process_losses() -> list[float]:
    """The whole batch in one process, row by row: a row holding a rare token goes through every block,
    any other row skips the last one."""
    model = GPT(CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(_STEPS):
        x, y = gated_batch(step)
        logits = []
        for row in x:
            h = model.tok_emb(row[None]) + model.pos_emb(torch.arange(row.shape[0]))
            for block in model.blocks if bool((row >= RARE).any()) else model.blocks[:-1]:
                h = block(h)
            logits.append(model.lm_head(model.ln_f(h)))
        logits = torch.cat(logits)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _judge_same_collectives(fn) -> Verdict:
    expected = _one_process_losses()
    for world in WORLDS:
        try:
            per_rank = launch(_train_gated, world, args=(fn,), timeout=_TIMEOUT_S)
        except LaunchError as e:
            if "NotYet" in str(e).splitlines()[0] or "NotYet" in str(e):
                raise NotYet() from None
            first = str(e).splitlines()[0]
            return Verdict.wrong(tr(f"{world} ranks did not finish together: {first}",
                                    f"{world} ранга не завершились вместе: {first}"))
        got = [sum(r[step] for r in per_rank) / world for step in range(_STEPS)]
        for step, (g, want) in enumerate(zip(got, expected)):
            if abs(g - want) > 1e-4 * abs(want):
                return Verdict.wrong(tr(
                    f"{world} ranks finished, but the loss of step {step + 1} is {num(g, 5)}, while one process "
                    f"on the whole batch, row by row, gets {num(want, 5)}: which rows go through the last block?",
                    f"{world} ранга завершились, но лосс шага {step + 1} равен {num(g, 5)}, а один процесс на всём "
                    f"батче, строка за строкой, получает {num(want, 5)}: какие строки проходят последний блок?"))
    return Verdict.right(tr("2, 3 and 4 ranks issue the same collectives and match one process",
                            "2, 3 и 4 ранга выдают одни и те же коллективные операции и совпадают с одним процессом"))


SAME_COLLECTIVES = CodeExercise("10.same_collectives", _judge_same_collectives, hidden,
                                (_hidden_if_any, _hidden_no_mask, _hidden_mask_by_position))
