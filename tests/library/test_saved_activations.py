"""SavedActivations counts what autograd keeps for backward, and nothing else."""
import torch
import torch.nn as nn

from fsdp_mini.saved_activations import SavedActivations
from small_model import TinyLM, batch


def test_a_linear_layer_saves_its_input_and_not_its_weight():
    lin = nn.Linear(8, 4)
    x = torch.randn(5, 8, requires_grad=True)
    with SavedActivations(exclude=lin.parameters()) as saved:
        lin(x).sum()
    assert saved.nbytes == x.numel() * 4
    with SavedActivations() as with_params:
        lin(x).sum()
    assert with_params.nbytes == x.numel() * 4 + lin.weight.numel() * 4


def test_activations_grow_with_the_batch_and_the_hooks_go_away():
    model = TinyLM()
    sizes = []
    for rows in (2, 4, 8):
        with SavedActivations(exclude=model.parameters()) as saved:
            model(*batch(model.cfg, rows))
        sizes.append(saved.nbytes)
    assert sizes[0] < sizes[1] < sizes[2]
    assert abs(sizes[2] - 2 * sizes[1]) < 0.01 * sizes[2]  # linear in the batch, up to a few constants
    after = saved.nbytes
    model(*batch(model.cfg, 8)).backward()
    assert saved.nbytes == after
