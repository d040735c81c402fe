"""The course's floor: everything the lessons, the demo and the benchmarks use that a user of the library
does not need. It imports the library (`fsdp_mini`); the library never imports it.

  lessons      language (English or Russian), exercise (checks of values and of code), exercises (the
               lessons' code exercises: judge, reference, planted mistakes), source (the library's real code),
               models (the small GPT every lesson trains), train (the shared loop), trace (compute spans
               beside CommLog), logged_step (one FSDP step logged on every rank: lessons 05 and 06), viz/ (one
               module per kind of picture)
  on paper     cost (alpha-beta time of a collective), ring_schedule (which chunk is where, step by step),
               cluster (a two-level network: a step's collectives priced per link), simulate (a calibrated
               simulator of a step, and extrapolation to a bigger cluster)
  measured     bench/ (fsdp_mini against PyTorch FSDP2 and DDP: cases, measure, report, command),
               bench_collectives (ring vs builtin collectives), pytorch_equivalent (the same strategy in
               PyTorch), demo (every strategy on one GPT)
  cli          `python -m fsdp_mini ...`: demo, ring-demo, bench, bench-collectives, simulate
"""
