"""Shared fixtures: every distributed test checks that no child process outlives it."""
import psutil
import pytest


@pytest.fixture
def no_orphans():
    """Yield, then assert that this process has no live children left (launch must reap them all)."""
    yield
    children = [c for c in psutil.Process().children(recursive=True) if c.is_running()
                and c.status() != psutil.STATUS_ZOMBIE]
    assert not children, f"processes left behind: {children}"
