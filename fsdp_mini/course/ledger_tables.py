"""Lesson 10's memory tables, in the lesson's language: a step's ledger by kind and phase, the peaks of
several setups side by side, and PyTorch's FSDPMemTracker beside the ledger.

The lesson's cells run the steps and assert what the numbers show; how the numbers are laid out teaches
nothing, so it lives here. Kinds and phases are named as `fsdp_mini.course.readings` names them
(`kind_name`, `phase_name`); headers and sentences come from the message table.
"""
from __future__ import annotations

from fsdp_mini.course.readings import kind_name, phase_name
from fsdp_mini.course.show import cell, say, show, text
from fsdp_mini.memory_ledger import KINDS, LedgerSnapshot

__all__ = ["design_name", "peak_of", "show_ledger", "show_peaks", "show_tracker_beside_ledger"]

_DESIGNS = {"flat": "flat_short", "fully_shard": "fully_shard_design"}


def design_name(design: str) -> str:
    """"flat" or "fully_shard" in the lesson's language."""
    return text(_DESIGNS[design])


def peak_of(peaks: dict[str, LedgerSnapshot]) -> LedgerSnapshot:
    """The step's peak: the phase peak with the most bytes (the first phase to reach it on a tie)."""
    return max(peaks.values(), key=lambda s: s.total)


def show_ledger(design: str, peaks: dict[str, LedgerSnapshot], forward_end: LedgerSnapshot) -> None:
    """`MemoryLedger.peaks` as a table (a row per kind, a column per phase, then the end of forward and
    the total), under the design's name, and a line on the step's peak."""
    say("ledger_design", design=design_name(design))
    snaps = {phase_name(p): s for p, s in peaks.items()}
    snaps[text("end_of_forward")] = forward_end
    first = text("ledger_kind")
    rows = [{first: kind_name(k), **{c: s.bytes[k] for c, s in snaps.items()}} for k in KINDS]
    rows.append({first: text("ledger_total_bytes"), **{c: s.total for c, s in snaps.items()}})
    show(rows, indent=2)
    top = peak_of(peaks)
    say("ledger_peak", total=top.total, phase=phase_name(top.phase), kind=kind_name(top.largest()[0]))


def show_peaks(runs: dict[str, tuple[dict[str, LedgerSnapshot], LedgerSnapshot]]) -> None:
    """Each setup's peak (`runs[message key] = (peaks, end of forward)`): its total, phase, activations
    and prefetch, and the activations at the end of forward."""
    rows = []
    for key, (peaks, forward_end) in runs.items():
        top = peak_of(peaks)
        rows.append({"peaks_setup": text(key), "peaks_total": top.total, "peaks_phase": phase_name(top.phase),
                     "peaks_activations": top.bytes["activations"], "peaks_prefetch": top.bytes["prefetch"],
                     "peaks_end_activations": forward_end.bytes["activations"]})
    show(rows)


# FSDPMemTracker's kinds, each beside the ledger's kind that counts the same bytes (None: not counted)
TRACKER_ROWS = [("Sharded Param", "parameters"), ("Sharded Grad", "gradients"), ("Unsharded Grad", None),
                ("OptState", "optimizer state"), ("Unsharded Param", "gathered"), ("All Gather", "prefetch"),
                ("Activation", "activations"), ("Temp", None), ("Inputs", None), ("Reduce Scatter", None),
                ("Buffer", None), ("Total", "total")]


def show_tracker_beside_ledger(tracked: dict[str, dict[str, int]], ours: dict[str, LedgerSnapshot],
                               phases=("forward", "backward")) -> None:
    """FSDPMemTracker's snapshot at each phase's peak (`tracked[phase][kind]`, bytes) on the left, the
    ledger's (`ours[phase]`) on the right, kind beside kind."""
    def numbers(values):
        return "".join(cell(v).rjust(10) for v in values)

    head = "".join(p.rjust(10) for p in phases)
    print(f"{'FSDPMemTracker':<16}{head}   {text('ledger_name'):<24}{head}")
    for theirs, kind in TRACKER_ROWS:
        row = f"{theirs:<16}" + numbers(tracked[p][theirs] for p in phases)
        if kind is None:
            print(row + f"   {text('not_counted')}")
            continue
        mine = [ours[p].total if kind == "total" else ours[p].bytes[kind] for p in phases]
        name = text("ledger_total") if kind == "total" else kind_name(kind)
        print(row + f"   {name:<24}" + numbers(mine))
