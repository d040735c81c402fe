"""Lessons 01 and 02's exercises: collectives written from point-to-point messages, by the learner.

Lesson 01 (collectives):
1. `my_broadcast(tensor, src)`: every rank's tensor becomes rank `src`'s, with send/recv only.
2. `obvious_all_reduce(tensor)`: the sum through rank 0 (reduce, then broadcast back), with send/recv.
Lesson 02 (the ring):
3. `my_reduce_scatter(chunks)`: the ring's first half; rank r returns chunk r summed over all ranks.
4. `my_all_gather(chunks)`: the ring's second half; every rank ends with every rank's chunk.

Each is run on real ranks (`fsdp_mini.launch`) at worlds 2, 3 and 4 and judged twice: by the values it
leaves (against torch's builtin collective, or against what every rank brought), and by the messages it
sent. The messages are counted by wrapping `torch.distributed`'s send/isend in the rank for the duration
of the trial, because the learner calls those directly and CommLog only sees `fsdp_mini.collectives`.
That is also how a builtin collective (`dist.all_reduce` where a ring was asked for) is caught.

The sizes are awkward on purpose: chunks of unequal lengths (11 elements over 3 or 4 ranks) and empty
chunks (2 elements over 3 or 4 ranks). Inputs are integer-valued floats, so sums are exact in any order,
and rank r's values are 2**r times a shared pattern: a wrong sum reads back as which ranks it holds.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fsdp_mini.comm_log import CommLog
from fsdp_mini.course.exercise import CodeExercise, NotYet, Verdict
from fsdp_mini.course.language import num, tr
from fsdp_mini.run import LaunchError, LaunchTimeout, launch

__all__ = ["BROADCAST", "OBVIOUS_ALL_REDUCE", "REDUCE_SCATTER", "ALL_GATHER", "my_broadcast",
           "obvious_all_reduce", "my_reduce_scatter", "my_all_gather", "WORLDS", "LENGTHS"]

WORLDS = (2, 3, 4)
LENGTHS = (12, 11, 2)  # divisible by 2, 3 and 4; unequal chunks; fewer elements than ranks (empty chunks)
_TIMEOUT_S = 40


# --- reference solutions (the lessons' folded solutions are these functions' source) -------------------

def my_broadcast(tensor, src=0):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == src:
        for dst in range(n):
            if dst != src:
                dist.send(tensor, dst=dst)
    else:
        dist.recv(tensor, src=src)  # straight into the caller's tensor: recv fills it in place


def obvious_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for src in range(1, n):  # reduce: rank 0 adds every other rank's tensor to its own
            dist.recv(incoming, src=src)
            tensor += incoming
        for dst in range(1, n):  # broadcast: and sends the sum back to each
            dist.send(tensor, dst=dst)
    else:
        dist.send(tensor, dst=0)
        dist.recv(tensor, src=0)


def my_reduce_scatter(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    send = chunks[(rank - 1) % n]  # step 0: this rank's own part of chunk r-1
    for step in range(n - 1):
        j = (rank - step - 2) % n  # the chunk whose running sum arrives from the left now
        recv = torch.empty_like(chunks[j])
        reqs = [dist.isend(send, dst=right), dist.irecv(recv, src=left)]
        for req in reqs:
            req.wait()
        send = recv + chunks[j]  # add this rank's part; the sum travels on at the next step
    return send  # after n-1 steps j == rank: chunk r summed over every rank


def my_all_gather(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        # forward the chunk received last step (at first this rank's own), receive the next one in
        # place
        reqs = [dist.isend(chunks[(rank - step) % n], dst=right),
                dist.irecv(chunks[(rank - step - 1) % n], src=left)]
        for req in reqs:
            req.wait()


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) ----------------------------

def _broadcast_from_rank_0(tensor, src=0):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:  # the root is always rank 0, whatever `src` says
        for dst in range(1, n):
            dist.send(tensor, dst=dst)
    else:
        dist.recv(tensor, src=0)


def _broadcast_into_a_new_tensor(tensor, src=0):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == src:
        for dst in range(n):
            if dst != src:
                dist.send(tensor, dst=dst)
    else:
        tensor = torch.empty_like(tensor)  # a new local name: the caller's tensor never changes
        dist.recv(tensor, src=src)


def _broadcast_builtin(tensor, src=0):
    dist.broadcast(tensor, src=src)  # right values, but not built from send/recv


def _all_reduce_overwrites(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for src in range(1, n):
            dist.recv(tensor, src=src)  # receives over its own values instead of adding them
        for dst in range(1, n):
            dist.send(tensor, dst=dst)
    else:
        dist.send(tensor, dst=0)
        dist.recv(tensor, src=0)


def _all_reduce_never_sends_back(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for src in range(1, n):
            dist.recv(incoming, src=src)
            tensor += incoming
    else:
        dist.send(tensor, dst=0)  # only rank 0 ends with the sum: a reduce, not an all-reduce


def _all_reduce_everyone_to_everyone(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    others = [q for q in range(n) if q != rank]
    incoming = [torch.empty_like(tensor) for _ in others]
    reqs = [dist.isend(tensor, dst=q) for q in others] + [dist.irecv(b, src=q) for b, q in zip(incoming, others)]
    for req in reqs:
        req.wait()
    for b in incoming:  # right sums, but every rank sends its tensor to every other: (n-1) S each
        tensor += b


def _reduce_scatter_sends_left(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    send = chunks[(rank - 1) % n]
    for step in range(n - 1):
        j = (rank - step - 2) % n
        recv = torch.empty_like(chunks[j])
        reqs = [dist.isend(send, dst=left), dist.irecv(recv, src=right)]  # the other way round, same indices
        for req in reqs:
            req.wait()
        send = recv + chunks[j]
    return send


def _reduce_scatter_n_steps(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    send = chunks[(rank - 1) % n]
    for step in range(n):  # one step too many
        j = (rank - step - 2) % n
        recv = torch.empty_like(chunks[j])
        reqs = [dist.isend(send, dst=right), dist.irecv(recv, src=left)]
        for req in reqs:
            req.wait()
        send = recv + chunks[j]
    return send


def _reduce_scatter_adds_the_sent_chunk(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    send, sent = chunks[(rank - 1) % n], (rank - 1) % n
    for step in range(n - 1):
        j = (rank - step - 2) % n
        recv = torch.empty_like(chunks[j])
        reqs = [dist.isend(send, dst=right), dist.irecv(recv, src=left)]
        for req in reqs:
            req.wait()
        send = recv + chunks[sent]  # adds its part of the chunk it sent, not of the one that arrived
        sent = j
    return send


def _reduce_scatter_with_all_reduce(chunks):
    full = torch.cat(chunks)
    dist.all_reduce(full)  # right values, but every rank receives every chunk
    return full.tensor_split(dist.get_world_size())[dist.get_rank()]


def _all_gather_forwards_its_own(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        reqs = [dist.isend(chunks[rank], dst=right),  # always its own chunk, never the one just received
                dist.irecv(chunks[(rank - step - 1) % n], src=left)]
        for req in reqs:
            req.wait()


def _all_gather_n_steps(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n):  # one step too many: the last chunk goes back to the rank that made it
        reqs = [dist.isend(chunks[(rank - step) % n], dst=right),
                dist.irecv(chunks[(rank - step - 1) % n], src=left)]
        for req in reqs:
            req.wait()


def _all_gather_direct(chunks):
    rank, n = dist.get_rank(), dist.get_world_size()
    others = [q for q in range(n) if q != rank]
    reqs = [dist.isend(chunks[rank], dst=q) for q in others] + [dist.irecv(chunks[q], src=q) for q in others]
    for req in reqs:  # right values and the ring's bytes, but sent to every rank, not to a neighbour
        req.wait()


# --- what runs on each rank: the trial, with its messages counted ---------------------------------------

_SENDS = ("send", "isend")
_COLLECTIVES = ("broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
                "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "scatter", "gather",
                "all_to_all", "all_to_all_single", "batch_isend_irecv")


@dataclass
class _Traffic:
    """What one rank did during a trial: (destination, bytes) of every send, the builtin collectives it
    called, and how many of fsdp_mini's own collectives CommLog saw (the exercise is to write them)."""

    sends: list
    collectives: list
    library_ops: int = 0


@contextmanager
def _watched():
    """Count this rank's sends and builtin collectives while the learner's function runs (the wrappers
    call the real functions, so the code still works; they are removed afterwards)."""
    traffic = _Traffic([], [])
    saved = {name: getattr(dist, name) for name in _SENDS + _COLLECTIVES if hasattr(dist, name)}

    def counting(real):
        def send(tensor, dst=None, *args, **kwargs):
            peer = dst if dst is not None else kwargs.get("group_dst")
            traffic.sends.append((peer, tensor.numel() * tensor.element_size()))
            return real(tensor, dst, *args, **kwargs)
        return send

    def noting(name, real):
        def collective(*args, **kwargs):
            traffic.collectives.append(name)
            return real(*args, **kwargs)
        return collective

    for name, real in saved.items():
        setattr(dist, name, counting(real) if name in _SENDS else noting(name, real))
    try:
        with CommLog() as log:
            yield traffic
        traffic.library_ops = len(log.records)
    finally:
        for name, real in saved.items():
            setattr(dist, name, real)


@dataclass(frozen=True)
class _Case:
    """One call of the learner's function on one rank: what it left, and the traffic it made."""

    result: object
    sends: tuple
    collectives: tuple
    library_ops: int


def _pattern(numel: int) -> torch.Tensor:
    """The shared pattern: small positive integers, different from chunk to chunk."""
    return 1.0 + (torch.arange(numel) * 5 % 13)


def _values(shape, rank: int) -> torch.Tensor:
    """Rank r's input: 2**r times the pattern, so any sum says which ranks it holds."""
    numel = 1
    for d in shape:
        numel *= d
    return (_pattern(numel) * 2 ** rank).reshape(shape)


def _on_rank(kind: str, fn, only: int | None = None):
    """Every case of one exercise (or case `only`) on this rank, in order; "not yet" when the body is
    unwritten."""
    rank, n = dist.get_rank(), dist.get_world_size()
    cases = []
    for k, case in enumerate(_cases(kind, n)):
        if only is not None and k != only:
            continue
        args, expected = _prepare(kind, case, rank, n)
        with _watched() as traffic:
            try:
                out = fn(*args)
            except NotImplementedError:
                return "not yet"
        result = _result(kind, args, out)
        cases.append((_Case(result, tuple(traffic.sends), tuple(traffic.collectives), traffic.library_ops), expected))
    return cases


def _cases(kind: str, n: int) -> list:
    if kind == "broadcast":
        return [((3, 5), src) for src in range(n)] + [((1,), n - 1)]
    if kind == "all_reduce":
        return [(7, 3), (5,)]
    if kind == "reduce_scatter":  # first with tags, values that say which parts a sum holds
        return [("tags", LENGTHS[0])] + [("values", length) for length in LENGTHS]
    return list(LENGTHS)


def _prepare(kind: str, case, rank: int, n: int):
    """The arguments of one call on this rank, and what the builtin says the result must be (computed
    before the learner's code runs, with torch.distributed's own collective)."""
    if kind == "broadcast":
        shape, src = case
        t = _values(shape, rank) - 3 * rank  # every rank's tensor differs from every other's
        want = t.clone()
        dist.broadcast(want, src=src)
        return (t, src), want
    if kind == "all_reduce":
        t = _values(case, rank)
        want = t.clone()
        dist.all_reduce(want)
        return (t,), want
    if kind == "reduce_scatter":
        how, length = case
        full = _values((length,), rank) if how == "values" else _tags(length, rank, n)
        want = full.clone()
        dist.all_reduce(want)
        return ([c.clone() for c in full.tensor_split(n)],), want.tensor_split(n)[rank].clone()
    # all_gather: chunk j is rank j's; the others' slots start as NaN (never written until received)
    mine = [_values((c.numel(),), j) + 1000 * j for j, c in enumerate(torch.empty(case).tensor_split(n))]
    slots = [m.clone() if j == rank else torch.full_like(m, float("nan")) for j, m in enumerate(mine)]
    return (slots,), [m.clone() for m in mine]


def _result(kind: str, args, out):
    if kind in ("broadcast", "all_reduce"):
        return args[0].clone()  # in place: the caller's tensor after the call
    if kind == "all_gather":
        return [c.clone() for c in args[0]]
    return out.detach().clone() if isinstance(out, torch.Tensor) else type(out).__name__


@dataclass(frozen=True)
class _Raised:
    """In place of a case's outcomes: the learner's function failed on some rank in this case."""

    message: str


def _run(kind: str, fn, world: int):
    """Run the trial on `world` ranks: per case, every rank's (outcome, expected), in rank order, up to the
    first case where the function raised (then a `_Raised`, last); or a Verdict when the ranks hung.

    All cases run in one launch; when a rank fails, the cases are run again one launch each, so that a
    wrong value in an early case is reported before a crash in a later one (ranks out of step crash)."""
    try:
        per_rank = _launch(kind, fn, world, None)
        return [list(case) for case in zip(*per_rank)]
    except LaunchTimeout:
        return _deadlock(world)
    except LaunchError:
        pass
    cases = []
    for k in range(len(_cases(kind, world))):
        try:
            cases.append([outcome[0] for outcome in _launch(kind, fn, world, k)])
        except LaunchTimeout:
            return _deadlock(world)
        except LaunchError as e:
            cases.append(_Raised(str(e).strip().splitlines()[0].replace(" failed: ", ": ", 1)))
            break
    return cases


def _launch(kind: str, fn, world: int, only: int | None) -> list:
    outcomes = launch(_on_rank, world, args=(kind, fn, only), timeout=_TIMEOUT_S)
    if any(o == "not yet" for o in outcomes):
        raise NotYet
    return outcomes


def _deadlock(world: int) -> Verdict:
    return Verdict.wrong(tr(
        f"world {world}: the ranks were still waiting after {_TIMEOUT_S} s, a send or recv without its "
        f"partner on the other rank (a deadlock)",
        f"число рангов {world}: ранги всё ещё ждали через {_TIMEOUT_S} с: send или recv без пары на другом ранге "
        f"(взаимная блокировка)"))


def _raised(world: int, case: str, raised: _Raised) -> Verdict:
    return Verdict.wrong(tr(f"world {world}, {case}: your function failed on ", f"число рангов {world}, {case}: ваша "
                            f"функция упала, ") + raised.message)


# --- diagnosis: say what a wrong tensor holds ----------------------------------------------------------

def _tags(length: int, rank: int, n: int) -> torch.Tensor:
    """Rank r's part of chunk j is 4**(r + n*j) everywhere (float64: exact up to 4**16), so a sum of parts
    reads back in base 4: digit r + n*j says how many times it holds rank r's part of chunk j."""
    return torch.cat([torch.full((c.numel(),), 4.0 ** (rank + n * j), dtype=torch.float64)
                      for j, c in enumerate(torch.empty(length).tensor_split(n))])


def _parts_text(value: float, n: int) -> str | None:
    """What a sum of tagged parts holds, chunk by chunk ("chunk 2 from ranks 0, 1 + ..."), or None."""
    if value != int(value) or not 0 < value < 4 ** (n * n):
        return None
    v, by_chunk = int(value), {}
    for p in range(n * n):
        count = v >> (2 * p) & 3
        if count:
            by_chunk.setdefault(p // n, []).append(str(p % n) + (f" ×{count}" if count > 1 else ""))
    return " + ".join(tr(f"chunk {j} from rank{'s' if len(rs) > 1 else ''} {', '.join(rs)}",
                         f"чанк {j} от ранг{'ов' if len(rs) > 1 else 'а'} {', '.join(rs)}")
                      for j, rs in sorted(by_chunk.items()))


def _ranks_in(got: torch.Tensor, pattern: torch.Tensor, n: int) -> list[int] | None:
    """The ranks whose contributions `got` sums, when it is such a sum of `pattern` (else None)."""
    if got.shape != pattern.shape or got.numel() == 0 or torch.isnan(got).any():
        return None
    ratio = got / pattern
    m = ratio.reshape(-1)[0].item()
    if not torch.all(ratio == m) or m != int(m) or not 0 < m < 2 ** n:
        return None
    return [r for r in range(n) if int(m) >> r & 1]


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _sum_text(ranks: list[int], n: int) -> str:
    if len(ranks) == n:
        return tr("the sum over every rank", "сумма по всем рангам")
    if len(ranks) == 1:
        return tr(f"rank {ranks[0]}'s values alone", f"только значения ранга {ranks[0]}")
    return tr(f"the sum over ranks {_ranks_text(ranks)} only", f"сумма только по рангам {_ranks_text(ranks)}")


def _in_s(nbytes: int, s: int) -> str:
    return f"{num(nbytes // s)} × S" if nbytes % s == 0 else f"{num(nbytes / s, 2)} × S"


def _not_p2p(world: int, rank: int, case: _Case) -> str:
    """"" when the rank used only send/isend/recv/irecv, else what it used instead."""
    if case.collectives:
        return tr(f"world {world}, rank {rank} called the builtin {case.collectives[0]}: here the collective is "
                  f"yours to build, from dist.send / dist.recv (or isend / irecv) only",
                  f"число рангов {world}, ранг {rank} вызвал встроенный {case.collectives[0]}: здесь коллективную операцию "
                  f"строите вы, только из dist.send / dist.recv (или isend / irecv)")
    if case.library_ops:
        return tr(f"world {world}, rank {rank} called a collective of fsdp_mini.collectives: here the collective "
                  f"is yours to build, from dist.send / dist.recv (or isend / irecv) only",
                  f"число рангов {world}, ранг {rank} вызвал коллективную операцию из fsdp_mini.collectives: здесь её "
                  f"строите вы, только из dist.send / dist.recv (или isend / irecv)")
    return ""


# --- exercise 1: my_broadcast --------------------------------------------------------------------------

def _judge_broadcast(fn) -> Verdict:
    for world in WORLDS:
        outcomes = _run("broadcast", fn, world)
        if isinstance(outcomes, Verdict):
            return outcomes
        for i, (shape, src) in enumerate(_cases("broadcast", world)):
            if isinstance(outcomes[i], _Raised):
                return _raised(world, f"src {src}, " + tr("shape", "форма") + f" {shape}", outcomes[i])
            inputs = [_values(shape, r) - 3 * r for r in range(world)]
            received, wrong = [0] * world, []
            for rank in range(world):
                case, want = outcomes[i][rank]
                problem = _not_p2p(world, rank, case)
                if problem:
                    return Verdict.wrong(problem)
                if not torch.equal(case.result, want):
                    owner = next((q for q, x in enumerate(inputs) if torch.equal(case.result, x)), None)
                    wrong.append((owner in (None, rank), rank, owner))
                for dst, nbytes in case.sends:
                    if dst is not None and 0 <= dst < world:
                        received[dst] += nbytes
            if wrong:  # a rank holding another rank's tensor says most: name it first
                _, rank, owner = min(wrong)
                if owner == rank:
                    what = tr(f"rank {rank}'s tensor is unchanged: the caller's tensor must be filled in place",
                              f"тензор ранга {rank} не изменился: тензор вызывающего нужно заполнить на месте")
                elif owner is not None:
                    what = tr(f"rank {rank} holds rank {owner}'s tensor, not rank {src}'s",
                              f"у ранга {rank} тензор ранга {owner}, а не ранга {src}")
                else:
                    what = tr(f"rank {rank} holds values that are no rank's tensor",
                              f"у ранга {rank} значения, которых нет ни у одного ранга")
                return Verdict.wrong(tr(f"world {world}, src {src}, shape {shape}: ",
                                        f"число рангов {world}, src {src}, форма {shape}: ") + what)
            s = want.numel() * want.element_size()
            extra = [q for q in range(world) if received[q] != (0 if q == src else s)]
            if extra:
                q = extra[0]
                return Verdict.wrong(tr(
                    f"world {world}, src {src}: rank {q} was sent {_in_s(received[q], s)} (S = {num(s)} B, the "
                    f"tensor); a broadcast sends each other rank the tensor once and src nothing",
                    f"число рангов {world}, src {src}: рангу {q} отправлено {_in_s(received[q], s)} (S = {num(s)} Б, "
                    f"тензор); broadcast отправляет каждому другому рангу тензор один раз, а src — ничего"))
    return Verdict.right(tr("Every rank got src's tensor, for every src, at worlds 2, 3 and 4; each rank was sent "
                            "it once.",
                            "Каждый ранг получил тензор src при любом src при 2, 3 и 4 рангах; каждому рангу он "
                            "отправлен один раз."))


# --- exercise 2: obvious_all_reduce --------------------------------------------------------------------

def _judge_all_reduce(fn) -> Verdict:
    for world in WORLDS:
        outcomes = _run("all_reduce", fn, world)
        if isinstance(outcomes, Verdict):
            return outcomes
        for i, shape in enumerate(_cases("all_reduce", world)):
            if isinstance(outcomes[i], _Raised):
                return _raised(world, tr("shape", "форма") + f" {shape}", outcomes[i])
            pattern = _values(shape, 0)
            for rank in range(world):
                case, want = outcomes[i][rank]
                problem = _not_p2p(world, rank, case)
                if problem:
                    return Verdict.wrong(problem)
                if not torch.equal(case.result, want):
                    ranks = _ranks_in(case.result, pattern, world)
                    what = (tr(" (it holds ", " (у него ") + _sum_text(ranks, world) + ")") if ranks else ""
                    return Verdict.wrong(tr(
                        f"world {world}, shape {shape}: rank {rank} does not end with dist.all_reduce's sum{what}",
                        f"число рангов {world}, форма {shape}: у ранга {rank} в конце не сумма dist.all_reduce{what}"))
            s = pattern.numel() * pattern.element_size()
            sent = [sum(b for _, b in outcomes[i][rank][0].sends) for rank in range(world)]
            through_0 = (sorted(outcomes[i][0][0].sends) == [(q, s) for q in range(1, world)]
                         and all(list(outcomes[i][q][0].sends) == [(0, s)] for q in range(1, world)))
            if not through_0:
                per_rank = ", ".join(f"{_in_s(b, s)}" for b in sent)
                return Verdict.wrong(tr(
                    f"world {world}: right sums, but the ranks sent [{per_rank}] (S = {num(s)} B); the obvious way "
                    f"goes all through rank 0: each other rank sends it its tensor once, and it sends the sum back "
                    f"to each",
                    f"число рангов {world}: суммы верны, но ранги отправили [{per_rank}] (S = {num(s)} Б); очевидный "
                    f"способ идёт целиком через ранг 0: каждый другой ранг один раз отправляет ему свой тензор, а он "
                    f"каждому отправляет сумму"))
    return Verdict.right(tr("The sums equal dist.all_reduce's at worlds 2, 3 and 4. Rank 0 sent (n - 1) × S, "
                            "3 × S at 4 ranks, every other rank S: rank 0's link is the bottleneck.",
                            "Суммы совпадают с dist.all_reduce при 2, 3 и 4 рангах. Ранг 0 отправил (n - 1) × S, "
                            "на 4 рангах 3 × S, каждый другой ранг — S: узкое место — канал ранга 0."))


# --- exercises 3 and 4: the ring's two halves ----------------------------------------------------------

def _ring_traffic(world: int, rank: int, case: _Case, length: int, total: int, expected_bytes: dict[int, int]) -> str:
    """"" when the rank sent to one neighbour only, as many bytes as the ring does in that direction
    (`expected_bytes`: direction +1 or -1 -> bytes), else what is off."""
    problem = _not_p2p(world, rank, case)
    if problem:
        return problem
    right, left = (rank + 1) % world, (rank - 1) % world
    peers = sorted({dst for dst, _ in case.sends})
    far = [p for p in peers if p not in (right, left)]
    if far:
        return tr(f"world {world}, length {length}: rank {rank} sent to rank {far[0]}, which is not its neighbour "
                  f"in the ring (ranks {left} and {right})",
                  f"число рангов {world}, длина {length}: ранг {rank} отправлял рангу {far[0]}, а это не его сосед по "
                  f"кольцу (ранги {left} и {right})")
    if len(peers) > 1:
        return tr(f"world {world}, length {length}: rank {rank} sent to both neighbours; a ring sends one way",
                  f"число рангов {world}, длина {length}: ранг {rank} отправлял обоим соседям; кольцо передаёт в одну "
                  f"сторону")
    if not peers:
        return tr(f"world {world}, length {length}: rank {rank} sent nothing",
                  f"число рангов {world}, длина {length}: ранг {rank} ничего не отправил")
    direction = 1 if peers[0] == right else -1
    sent = sum(b for _, b in case.sends)
    want = expected_bytes[direction]
    if sent != want:
        return tr(f"world {world}, length {length} (S = {num(total)} B): rank {rank} sent {num(sent)} B in "
                  f"{len(case.sends)} messages; on the ring it sends n - 1 chunks, {num(want)} B here",
                  f"число рангов {world}, длина {length} (S = {num(total)} Б): ранг {rank} отправил {num(sent)} Б в "
                  f"{len(case.sends)} сообщениях; по кольцу он отправляет n - 1 чанков, здесь {num(want)} Б")
    return ""


def _judge_reduce_scatter(fn) -> Verdict:
    for world in WORLDS:
        outcomes = _run("reduce_scatter", fn, world)
        if isinstance(outcomes, Verdict):
            return outcomes
        for i, (how, length) in enumerate(_cases("reduce_scatter", world)):
            if isinstance(outcomes[i], _Raised):
                return _raised(world, tr("length", "длина") + f" {length}", outcomes[i])
            chunks = _values((length,), 0).tensor_split(world)
            for rank in range(world):
                case, want = outcomes[i][rank]
                problem = _not_p2p(world, rank, case)
                if problem:
                    return Verdict.wrong(problem)
                got = case.result
                where = tr(f"world {world}, length {length}: rank {rank} ", f"число рангов {world}, длина {length}: ранг {rank} ")
                if not isinstance(got, torch.Tensor):
                    return Verdict.wrong(where + tr(f"returned {got}, not a tensor", f"вернул {got}, а не тензор"))
                if got.shape != want.shape:
                    return Verdict.wrong(where + tr(
                        f"returned {tuple(got.shape)}; chunk {rank} has shape {tuple(want.shape)}",
                        f"вернул {tuple(got.shape)}; у чанка {rank} форма {tuple(want.shape)}"))
                if not torch.equal(got, want) and how == "tags":
                    parts = _parts_text(got.reshape(-1)[0].item(), world) if got.numel() else None
                    if parts and torch.all(got == got.reshape(-1)[0]):
                        return Verdict.wrong(where + tr(
                            f"ends with {parts}; expected chunk {rank} from every rank once",
                            f"заканчивает с суммой: {parts}; ожидался чанк {rank} от каждого ранга по разу"))
                if not torch.equal(got, want):
                    holds = [(j, _ranks_in(got, c, world)) for j, c in enumerate(chunks) if c.shape == got.shape]
                    holds = [(j, ranks) for j, ranks in holds if ranks]
                    holds.sort(key=lambda h: (h[0] != rank, -len(h[1])))
                    if holds:
                        j, ranks = holds[0]
                        what = tr(f"ends with chunk {j}, ", f"заканчивает с чанком {j} — ") + _sum_text(ranks, world)
                    else:
                        what = tr("ends with values that are no sum of any chunk's parts",
                                  "заканчивает со значениями, которые не сумма частей ни одного чанка")
                    return Verdict.wrong(where + what + tr(f"; expected chunk {rank}'s sum over every rank",
                                                           f"; ожидалась сумма чанка {rank} по всем рангам"))
                sizes = [c.numel() * want.element_size() for c in chunks]
                problem = _ring_traffic(world, rank, case, length, sum(sizes),
                                        {d: sum(sizes) - sizes[rank] for d in (1, -1)})
                if problem:
                    return Verdict.wrong(problem)
    return Verdict.right(tr("Every rank ended with its chunk of dist.all_reduce's sum, at worlds 2, 3 and 4, "
                            "sending (n - 1)/n of the tensor to one neighbour.",
                            "Каждый ранг закончил со своим чанком суммы dist.all_reduce при 2, 3 и 4 рангах, "
                            "отправив одному соседу (n - 1)/n тензора."))


def _judge_all_gather(fn) -> Verdict:
    for world in WORLDS:
        outcomes = _run("all_gather", fn, world)
        if isinstance(outcomes, Verdict):
            return outcomes
        for i, length in enumerate(LENGTHS):
            if isinstance(outcomes[i], _Raised):
                return _raised(world, tr("length", "длина") + f" {length}", outcomes[i])
            for rank in range(world):
                case, want = outcomes[i][rank]
                problem = _not_p2p(world, rank, case)
                if problem:
                    return Verdict.wrong(problem)
                where = tr(f"world {world}, length {length}: on rank {rank}, ", f"число рангов {world}, длина {length}: "
                           f"на ранге {rank} ")
                for j, (got, mine) in enumerate(zip(case.result, want)):
                    if torch.equal(got, mine):
                        continue
                    if torch.isnan(got).all() and got.numel():
                        what = tr(f"chunk {j} was never received", f"чанк {j} так и не получен")
                    else:
                        owner = next((q for q, m in enumerate(want) if m.shape == got.shape and torch.equal(got, m)), None)
                        what = (tr(f"chunk {j} holds rank {owner}'s chunk, not rank {j}'s",
                                   f"в чанке {j} чанк ранга {owner}, а не ранга {j}") if owner is not None else
                                tr(f"chunk {j} holds values that are no rank's chunk",
                                   f"в чанке {j} значения, которых нет ни в одном чанке"))
                    return Verdict.wrong(where + what)
                sizes = [m.numel() * 4 for m in want]
                problem = _ring_traffic(world, rank, case, length, sum(sizes),
                                        {d: sum(sizes) - sizes[(rank + d) % world] for d in (1, -1)})
                if problem:
                    return Verdict.wrong(problem)
    return Verdict.right(tr("Every rank ended with every rank's chunk, at worlds 2, 3 and 4, sending (n - 1)/n of "
                            "the result to one neighbour.",
                            "Каждый ранг получил чанки всех рангов при 2, 3 и 4 рангах, отправив одному соседу "
                            "(n - 1)/n результата."))


BROADCAST = CodeExercise("01.my_broadcast", _judge_broadcast, my_broadcast,
                         (_broadcast_from_rank_0, _broadcast_into_a_new_tensor, _broadcast_builtin))
OBVIOUS_ALL_REDUCE = CodeExercise("01.obvious_all_reduce", _judge_all_reduce, obvious_all_reduce,
                                  (_all_reduce_overwrites, _all_reduce_never_sends_back,
                                   _all_reduce_everyone_to_everyone))
REDUCE_SCATTER = CodeExercise("02.my_reduce_scatter", _judge_reduce_scatter, my_reduce_scatter,
                              (_reduce_scatter_sends_left, _reduce_scatter_n_steps,
                               _reduce_scatter_adds_the_sent_chunk, _reduce_scatter_with_all_reduce))
ALL_GATHER = CodeExercise("02.my_all_gather", _judge_all_gather, my_all_gather,
                          (_all_gather_forwards_its_own, _all_gather_n_steps, _all_gather_direct))
