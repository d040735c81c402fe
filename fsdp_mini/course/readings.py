"""The library's messages read in the lesson's language.

`fsdp_mini` speaks English, as PyTorch does, and a Russian lesson prints its messages as they are. Under
each one it prints a reading in Russian, built from the message's structure rather than translated word
for word: the ranks, the collectives and what each rank did in a flight-recorder verdict; the stuck ranks
and the timeout of a `LaunchTimeout`; the budget, the phase and the bytes of each kind of a
`MemoryBudgetExceeded`.

    print_with_reading("verdict: ", verdict)   # the library's sentence; in Russian, its reading below

`read(text)` takes every sentence `fsdp_mini` writes about a failed run: a verdict (`find_divergence`,
the "ranks diverged: ..." line of a `LaunchError`, `python -m fsdp_mini diagnose` and its notes) and the
headline of a `LaunchError` or `LaunchTimeout` or of `diagnose` (a rank that failed, was killed, exited or
died, an interrupted run). A verdict's structure is parsed back from the sentence (the library hands over only the
sentence); rendered in English, the parsed structure gives the library's sentence back, character for
character (tests/course/test_language.py checks it on the library's own verdicts), so a change of the library's
wording fails a test instead of printing a wrong reading. `read_budget(snapshot, budget)` reads a
`MemoryBudgetExceeded` from the fields the exception carries (`.snapshot`, `.budget`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from fsdp_mini.course.language import get_language, num, plural, size, tr
from fsdp_mini.memory_ledger import LedgerSnapshot, MemoryBudgetExceeded

__all__ = ["KIND_NAMES", "PHASE_NAMES", "kind_name", "phase_name", "Collective", "Side", "Verdict",
           "parse_verdict", "read", "read_budget", "print_with_reading"]

# The ledger's kinds (`fsdp_mini.memory_ledger.KINDS`) and phases (`PHASES`) in Russian.
KIND_NAMES = {
    "parameters": "параметры",
    "gradients": "градиенты",
    "optimizer state": "состояние оптимизатора",
    "gathered": "собранные параметры",
    "prefetch": "предвыборка",
    "activations": "активации",
}
PHASE_NAMES = {"forward": "forward", "backward": "backward", "optimizer step": "шаг оптимизатора"}
_DURING = {"forward": "во время forward", "backward": "во время backward",
           "optimizer step": "во время шага оптимизатора"}


def kind_name(kind: str) -> str:
    """A ledger kind ("optimizer state") in the lesson's language."""
    return tr(kind, KIND_NAMES[kind])


def phase_name(phase: str) -> str:
    """A ledger phase ("optimizer step") in the lesson's language."""
    return tr(phase, PHASE_NAMES[phase])


def _ranks_ru(ranks) -> str:
    ranks = list(ranks)
    return f"ранг {ranks[0]}" if len(ranks) == 1 else "ранги " + ", ".join(map(str, ranks))


def _ranks_en(ranks) -> str:
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _seconds(text: str) -> str:
    """A number of seconds as the library printed it ("5", "2.5"), in the lesson's number format."""
    return num(float(text), len(text.partition(".")[2]))


# ------------------------------------------------------------------------------------------- verdicts

@dataclass(frozen=True)
class Collective:
    """A collective as a verdict names it (`Entry.describe`): "AllGather #3 (blocks.2, forward)",
    "AllReduce #1 of (4,) float32"."""

    op: str
    seq: int
    label: str = ""
    phase: str = ""
    shapes: tuple[str, ...] = ()  # as printed, e.g. "(4,)"; empty when the verdict leaves them out
    dtype: str = ""

    def render(self) -> str:
        where = ", ".join(x for x in (self.label, self.phase) if x)
        text = f"{self.op} #{self.seq}" + (f" ({where})" if where else "")
        if self.shapes:
            shapes = ", ".join(self.shapes)
            text += tr(f" of {shapes} {self.dtype}",
                       f" с {'тензором' if len(self.shapes) == 1 else 'тензорами'} {shapes} {self.dtype}")
        return text


_COLLECTIVE = (r"(?P<op>\w+) #(?P<seq>\d+)(?: \((?P<where>[^()]*)\))?"
               r"(?: of (?P<shapes>\([\d, ]*\)(?:, \([\d, ]*\))*) (?P<dtype>\w+))?")


def _collective(text: str) -> Collective:
    m = re.fullmatch(_COLLECTIVE, text)
    if not m:
        raise ValueError(f"not a collective as fsdp_mini describes one: {text!r}")
    parts = m["where"].split(", ") if m["where"] else []
    phase = parts.pop() if parts and parts[-1] in ("forward", "backward") else ""
    shapes = tuple(re.findall(r"\([\d, ]*\)", m["shapes"])) if m["shapes"] else ()
    return Collective(m["op"], int(m["seq"]), ", ".join(parts), phase, shapes, m["dtype"] or "")


@dataclass(frozen=True)
class Side:
    """The ranks that did the same thing at the diverging number: `issued` or `waits in` a collective,
    or issued none (`collective` is None; `last` is the last one they issued, if the verdict names it)."""

    ranks: tuple[int, ...]
    verb: str  # "issued", "waits in" (one rank and several alike) or "none"
    collective: Collective | None
    seq: int
    last: Collective | None = None

    def render(self, elide_verb: bool = False) -> str:
        one = len(self.ranks) == 1
        if get_language() != "ru":
            who = _ranks_en(self.ranks)
            if self.verb == "none":
                last = f" (its last: {self.last.render()})" if self.last else ""
                return f"{who} issued no collective #{self.seq}{last}"
            verb = self.verb if self.verb == "issued" or one else "wait in"
            return f"{who} {verb} {self.collective.render()}"
        who = _ranks_ru(self.ranks)
        if self.verb == "none":
            last = f" (последняя запущенная — {self.last.render()})" if self.last else ""
            verb = "не запускал" if one else "не запускали"
            return f"{who} {verb} коллективную операцию #{self.seq}{last}"
        if elide_verb:
            return f"{who} — {'в ' if self.verb == 'waits in' else ''}{self.collective.render()}"
        verb = {"issued": ("запустил", "запустили"), "waits in": ("ждёт в", "ждут в")}[self.verb][0 if one else 1]
        return f"{who} {verb} {self.collective.render()}"


@dataclass(frozen=True)
class Verdict:
    """A flight-recorder verdict: the odd side first, then the others; `group` when the diverging group
    is not the whole world; `prefixed` when it came as a `LaunchError`'s first line ("ranks diverged: ")."""

    sides: tuple[Side, ...]
    group: tuple[int, ...] | None = None
    prefixed: bool = False

    def render(self) -> str:
        first, *rest = self.sides
        if get_language() != "ru":
            text = first.render() + " while " + " and ".join(s.render() for s in rest)
            where = f" (in the group of ranks {list(self.group)})" if self.group else ""
            return ("ranks diverged: " if self.prefixed else "") + text + where
        # the verb is left out («а ранги 0, 2, 3 — AllGather #3») where the side before says it
        others = [s.render(elide_verb=s.verb == before.verb != "none") for before, s in zip(self.sides, rest)]
        text = first.render() + ", а " + " и ".join(others)
        where = f" (в группе рангов {', '.join(map(str, self.group))})" if self.group else ""
        return ("ранги разошлись: " if self.prefixed else "") + text + where


_SIDE = re.compile(r"(?:rank (?P<one>\d+)|ranks (?P<many>\d+(?:, \d+)*)) "
                   r"(?:issued no collective #(?P<none>\d+)(?: \(its last: (?P<last>.*)\))?"
                   r"|(?P<verb>issued|waits in|wait in) (?P<collective>.*))")


def _side(text: str) -> Side:
    m = _SIDE.fullmatch(text)
    if not m:
        raise ValueError(f"not a side of a verdict: {text!r}")
    ranks = (int(m["one"]),) if m["one"] else tuple(int(r) for r in m["many"].split(", "))
    if m["none"]:
        last = _collective(m["last"]) if m["last"] else None
        return Side(ranks, "none", None, int(m["none"]), last)
    collective = _collective(m["collective"])
    verb = "issued" if m["verb"] == "issued" else "waits in"
    return Side(ranks, verb, collective, collective.seq)


def parse_verdict(sentence: str) -> Verdict | None:
    """The structure of a verdict sentence, or None if `sentence` is not a verdict."""
    prefixed = sentence.startswith("ranks diverged: ")
    body = sentence.removeprefix("ranks diverged: ")
    group = None
    found = re.search(r" \(in the group of ranks \[([\d, ]+)\]\)$", body)
    if found:
        group = tuple(int(r) for r in found[1].split(", "))
        body = body[:found.start()]
    if " while " not in body:
        return None
    first, rest = body.split(" while ", 1)
    try:
        sides = tuple(_side(s) for s in [first, *rest.split(" and ")])
    except ValueError:
        return None
    return Verdict(sides, group, prefixed)


# ---------------------------------------------------------------------------------- other sentences

def _launch_timeout(m: re.Match) -> str:
    stuck = [int(r) for r in m["stuck"].split(", ")]
    returned = [int(r) for r in m["returned"].split(", ")] if m["returned"] else []
    one = len(stuck) == 1
    text = f"{_ranks_ru(stuck)} {'не завершился' if one else 'не завершились'} за {_seconds(m['s'])} с"
    if returned:
        text += f" ({_ranks_ru(returned)} {'вернул' if len(returned) == 1 else 'вернули'} результат)"
    return text + ": все ли ранги вызывают одни и те же коллективные операции в одном и том же порядке?"


def _rank_failed(m: re.Match) -> str:
    return f"ранг {m['rank']} упал: {m['what']}"  # the rank's own exception, as Python or PyTorch wrote it


def _waiting(m: re.Match) -> str:
    waits = [re.fullmatch(r"rank (\d+) in (.*)", w) for w in m["waiting"].split("; ")]
    return ("ранги согласны во всех записанных коллективных операциях; ждут: "
            + "; ".join(f"ранг {w[1]} — в {_collective(w[2]).render()}" for w in waits))


# (pattern of the library's sentence, its Russian reading): run.py's and flight_recorder.py's
_SENTENCES = [
    (r"ranks \[(?P<stuck>[\d, ]+)\] did not finish within (?P<s>[\d.]+) s"
     r"(?: \(ranks \[(?P<returned>[\d, ]+)\] returned\))?: "
     r"do all ranks call the same collectives in the same order\?", _launch_timeout),
    (r"rank (?P<rank>\d+) failed: (?P<what>.*)", _rank_failed),
    (r"rank (?P<rank>\d+) was killed by signal (?P<signal>\d+)(?: \((?P<name>\w+)\))?",
     lambda m: f"ранг {m['rank']} убит сигналом {m['signal']}" + (f" ({m['name']})" if m["name"] else "")),
    (r"rank (?P<rank>\d+) exited with code (?P<code>-?\d+) without reporting \(os\._exit\?\)",
     lambda m: f"ранг {m['rank']} завершился с кодом {m['code']}, ничего не сообщив (os._exit?)"),
    (r"rank (?P<rank>\d+) exited with code (?P<code>-?\d+) \(fsdp_mini\.finish or sys\.exit\)",
     lambda m: f"ранг {m['rank']} завершился с кодом {m['code']} (fsdp_mini.finish или sys.exit)"),
    (r"(?:rank (?P<one>\d+)|ranks (?P<many>[\d, ]+)) died: (?:its process|their processes) ended without an end "
     r"record \(killed by a signal, or os\._exit\?\)",
     lambda m: (f"ранг {m['one']} умер: его процесс завершился" if m["one"] else
                f"ранги {m['many']} умерли: их процессы завершились")
               + f", не оставив записи о завершении ({'убит' if m['one'] else 'убиты'} сигналом или os._exit?)"),
    (r"the run was interrupted: no rank left an end record \((?P<ranks>ranks? [\d, ]+); killed together, "
     r"e\.g\. with their agent\?\)",
     lambda m: f"запуск прерван: ни один ранг не оставил записи о завершении "
               f"({_ranks_ru(int(r) for r in m['ranks'].split(' ', 1)[1].split(', '))}; "
               f"их убили разом, например вместе с агентом?)"),
    (r"\((?:rank (?P<one>\d+)|ranks (?P<many>[\d, ]+)) failed the same way\)",
     lambda m: f"(ранг {m['one']} упал так же)" if m["one"] else f"(ранги {m['many']} упали так же)"),
    (r"\(ranks \[(?P<ranks>[\d, ]+)\] failed after it; ranks still running were killed\)",
     lambda m: f"({_ranks_ru(int(r) for r in m['ranks'].split(', '))} упали после него; "
               f"ранги, которые ещё работали, завершены)"),
    (r"no flight records \(rank<r>\.flight\) in (?P<folder>.*)",
     lambda m: f"в {m['folder']} нет файлов бортового самописца (rank<r>.flight)"),
    (r"ranks \[(?P<ranks>[\d, ]+)\] agree on every recorded collective, and none is waiting in one",
     lambda m: f"ранги {m['ranks']} согласны во всех записанных коллективных операциях, "
               f"и ни один из них не ждёт"),
    (r"the ranks agree on every recorded collective; waiting: (?P<waiting>.*)", _waiting),
    (r"\(ignored (?P<files>.*): from an earlier run(?: of (?P<world>\d+) ranks)?, (?P<run>.*)\)",
     lambda m: f"(пропущены {m['files']}: они от прошлого запуска"
               + (f" на {m['world']} {plural(int(m['world']), 'ранг', 'ранга', 'рангов')}" if m["world"] else "")
               + f", {'без идентификатора запуска' if m['run'] == 'without a run id' else m['run']})"),
    (r"\(no record of (?:rank (?P<one>\d+)|ranks (?P<many>[\d, ]+)); this run had (?P<world>\d+) ranks\)",
     lambda m: f"(нет записей {'ранга ' + m['one'] if m['one'] else 'рангов ' + m['many']}; "
               f"в этом запуске {m['world']} {plural(int(m['world']), 'ранг', 'ранга', 'рангов')})"),
]


def read(text: str) -> str:
    """A sentence `fsdp_mini` wrote about a failed run, in the lesson's language: unchanged in English,
    its reading in Russian. Raises ValueError for a sentence it does not know (rather than print
    English where the lesson promised a reading)."""
    if "\n" in text:  # diagnose's verdict, then the notes on what it left out: line by line
        return "\n".join(read(line) for line in text.split("\n"))
    verdict = parse_verdict(text)
    if verdict is not None:
        return verdict.render()
    if get_language() != "ru":
        return text
    for pattern, reading in _SENTENCES:
        m = re.fullmatch(pattern, text)
        if m:
            return reading(m)
    raise ValueError(f"no reading for this sentence: {text!r}")


def read_budget(snapshot: LedgerSnapshot, budget: int) -> str:
    """A `MemoryBudgetExceeded` in the lesson's language, from its fields (`.snapshot`, `.budget`): in
    English the exception's own message, in Russian its reading."""
    if get_language() != "ru":
        return str(MemoryBudgetExceeded(snapshot, budget))
    kind, nbytes = snapshot.largest()
    return (f"бюджет памяти {size(budget)} превышен {_DURING[snapshot.phase]}: занято {size(snapshot.total)}, "
            f"больше всего — {KIND_NAMES[kind]} ({size(nbytes)}); "
            + ", ".join(f"{KIND_NAMES[k]} {size(v)}" for k, v in snapshot.bytes.items() if v))


def print_with_reading(label: str, text: str, reading: str | None = None) -> None:
    """Print `label` and a message the library (or PyTorch) wrote, as it wrote it; in a Russian lesson,
    its reading under it, aligned with the message (`reading`, or `read(text)` by default: then a message
    of several lines is printed line by line, each with its reading under it)."""
    indent = " " * len(label)
    if get_language() != "ru":
        print(label + text.replace("\n", "\n" + indent))
    elif reading is None:
        for i, line in enumerate(text.split("\n")):
            print((indent if i else label) + line)
            print(indent + read(line))
    else:
        print(label + text.replace("\n", "\n" + indent))
        print(indent + reading.replace("\n", "\n" + indent))
