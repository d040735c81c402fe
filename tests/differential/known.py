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


KNOWN: list[Known] = [
]


def reason_for(desc: dict, diff) -> str | None:
    for k in KNOWN:
        if k.applies(desc, diff):
            return f"{k.name}: {k.reason}"
    return None
