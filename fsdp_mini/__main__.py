"""`python -m fsdp_mini ...` (and torchrun's `-m fsdp_mini`): the course's command line.

The only file of the library's floor that names the course: the command line (demo, benchmarks,
simulator) is the course's, in `fsdp_mini.course.cli`; this entry point only forwards to it, and nothing
in the library imports it.
"""
from fsdp_mini.course.cli import entry_point

if __name__ == "__main__":
    entry_point()
