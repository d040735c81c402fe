"""`python -m fsdp_mini bench`: fsdp_mini against PyTorch FSDP2 and DDP, side by side, in one run.

For each GPT size and world size, every *case* (an engine and a strategy) trains the same model on the
same global batch. One module per job:

    cases     which sizes and contestants, and how one is built and stepped on a rank
    measure   memory and bytes (one launch per case), interleaved step times, collective calibration
    report    medians and ratios, the table, the performance targets, the plot
    command   the command line: measure (or --load a saved run), report, optionally simulate

`run` and `summarize` are what lesson 06 calls; the rest is for the command line and the tests.
"""
from fsdp_mini.course.bench.cases import CASES, SIZES, Case, model_numel, parse_case, parse_cases, parse_sizes
from fsdp_mini.course.bench.measure import PHASES, calibrate, memory_worker, run, time_worker, timed_step
from fsdp_mini.course.bench.report import plot, summarize, table, targets, targets_text

__all__ = ["CASES", "SIZES", "Case", "model_numel", "parse_case", "parse_cases", "parse_sizes", "PHASES",
           "calibrate", "memory_worker", "run", "time_worker", "timed_step", "plot", "summarize", "table",
           "targets", "targets_text"]
