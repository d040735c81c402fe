"""`fsdp_mini.course.activation_runs`: what of lesson 11's per-rank plumbing can be checked on one process
(the runs themselves execute, with their asserts, in the lesson under nbval)."""
import pytest
import torch

from fsdp_mini.course.activation_runs import RecordedTo


def test_recorded_to_lists_moves_and_casts_in_order_and_puts_to_back():
    original = torch.Tensor.to
    x = torch.ones(3)
    with RecordedTo() as recorded:
        x.to(torch.device("cpu")).to(torch.bfloat16)
    assert recorded.calls == [(torch.float32, "device"), (torch.float32, torch.bfloat16)]
    assert torch.Tensor.to is original
    with pytest.raises(RuntimeError), RecordedTo():
        raise RuntimeError("a failing unshard")
    assert torch.Tensor.to is original
