"""`fsdp_mini.course.activations`: the formula lesson 11 gives for what one block of the course's GPT keeps
for backward equals what autograd saves (`measure_block`, through `fsdp_mini.saved_activations.SavedActivations`).
Moved from tests/library/test_activation_checkpointing.py: it is about the course's model and formula."""
from fsdp_mini.course.activations import course_bytes, measure_block
from fsdp_mini.course.models import GPT, GPTConfig


def test_the_course_formula_is_what_autograd_saves():
    for b, s, h, a in [(8, 16, 30, 2), (2, 64, 64, 4), (3, 32, 48, 6)]:
        block = GPT(GPTConfig(n_embd=h, n_head=a, block_size=s)).blocks[0]
        assert measure_block(block, b, s) == course_bytes(s, b, h, a)
