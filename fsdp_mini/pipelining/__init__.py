"""Pipeline parallelism, where PyTorch keeps it (`torch.distributed.pipelining`): the model cut into stages, one
per rank, each micro-batch's activations sent forward and its gradients sent back.

    stage       `PipelineStage`: one rank's slice of the model and the sends that join it to its neighbours
    schedules   `ScheduleGPipe`, `Schedule1F1B`, `ScheduleInterleaved1F1B`: the order of each rank's forwards and
                backwards, as a list of actions (`pipeline_order`) that the schedule runs and a lesson can print

A script written for PyTorch's schedules runs here by its import line: `PipelineStage(module, stage_index,
num_stages, device)`, `Schedule1F1B(stage, n_microbatches, loss_fn)`, `schedule.step(x)` on the first stage,
`schedule.step(target=y, losses=losses)` on the last, `schedule.step()` between.
"""
from fsdp_mini.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "PipelineStage": "fsdp_mini.pipelining.stage:PipelineStage",
    "ScheduleGPipe": "fsdp_mini.pipelining.schedules:ScheduleGPipe",
    "Schedule1F1B": "fsdp_mini.pipelining.schedules:Schedule1F1B",
    "ScheduleInterleaved1F1B": "fsdp_mini.pipelining.schedules:ScheduleInterleaved1F1B",
    "PipelineScheduleSingle": "fsdp_mini.pipelining.schedules:PipelineScheduleSingle",
    "PipelineScheduleMulti": "fsdp_mini.pipelining.schedules:PipelineScheduleMulti",
})
