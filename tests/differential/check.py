"""What a test asserts: fsdp_mini and PyTorch agree on a description (the known differences aside)."""
from __future__ import annotations

from differential.compare import differences
from differential.execute import execute


def assert_agrees(desc: dict) -> None:
    findings, _known = differences(desc, execute([desc])[0])
    assert not findings, "fsdp_mini and PyTorch differ:\n" + "\n".join(f"  {d}" for d in findings)
