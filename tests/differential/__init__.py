"""A randomized differential harness: fsdp_mini against PyTorch (FSDP2 for `fully_shard`, FSDP1 for `FSDP`).

generator (seed -> a program description: plain, printable data), models (the description's model),
wrapping (each implementation's way to shard it), runner (a description on one implementation, inside
launched ranks: an observation), execute (many descriptions per launch of the world), compare (two
observations -> differences in words), known (the deliberate differences, each with its reason),
minimise (a smaller description that still differs), writer (a minimised difference as a case of
test_found.py: found/<name>.py),
fuzz (`make fuzz`: random seeds until the time is up).
"""
