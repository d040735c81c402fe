"""show_source shows the real code: whole, a slice of it, or a function's signature and docstring."""
import inspect

import pytest

from fsdp_mini.run import launch
from fsdp_mini.course.source import show_source, source_of


def test_whole_source_is_inspect_getsource():
    assert source_of(source_of) == inspect.getsource(source_of).rstrip()


def test_a_slice_from_start_to_end():
    part = source_of(launch, start="local_world_size = world_size if", end="check_backend")
    lines = part.splitlines()
    assert lines[0].startswith("local_world_size = world_size if") and "check_backend" in lines[-1]
    assert len(lines) == 3
    with pytest.raises(ValueError, match="not found"):
        source_of(launch, start="no such line")


def test_header_is_signature_and_docstring():
    head = source_of(launch, header=True)
    assert head.startswith("def launch(") and head.endswith('"""')
    assert "ctx = get_context" not in head and launch.__doc__.strip().splitlines()[0] in head


def test_show_source_prints_outside_a_notebook(capsys):
    show_source(launch, header=True)
    assert capsys.readouterr().out.startswith("def launch(")
