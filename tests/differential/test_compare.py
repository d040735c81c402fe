"""The comparator's tolerances: loose enough for bf16's rounding, tight enough for a wrong value."""
import torch

from differential.compare import _tensor_diff, _tol


def test_bf16_one_rounding_of_the_scale_passes_where_contributions_cancel():
    # momentum buffers one bf16 step (at 64..128: 0.5) apart on an element near zero, as seed 67429934 found
    ours = torch.tensor([72.0, 0.125, -30.0])
    theirs = torch.tensor([71.5, -0.375, -30.0])
    assert _tensor_diff(ours, theirs, _tol(bf16=True)) is None
    assert _tensor_diff(ours, theirs, _tol(bf16=False)) is not None  # fp32 holds to 1e-4


def test_bf16_a_wrong_value_is_still_found():
    theirs = torch.tensor([72.0, 10.0, -30.0])
    for wrong in (theirs * 1.1, theirs + torch.tensor([0.0, 5.0, 0.0]), theirs / 2):  # 10 %, one element, a halving
        assert _tensor_diff(wrong, theirs, _tol(bf16=True)) is not None
