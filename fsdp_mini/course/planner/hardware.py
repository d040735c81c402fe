"""The GPUs the planner knows, each number with where it comes from.

Per GPU: dense tensor-core peaks (bf16, and fp8 where the chip has it), HBM capacity and bandwidth,
NVLink bandwidth to the other GPUs of its node (one direction), network bandwidth to other nodes (one
direction, one NIC per GPU as in DGX and Grand Teton hosts), and the latency a ring pays per step on each.

Bandwidths are per direction: a ring sends and receives at once, and the alpha-beta formulas of
`fsdp_mini.course.cost` count the bytes one rank sends. Capacities are what `torch.cuda` can reserve at
most: the card's memory (80 GB cards hold 80 GiB = 81,920 MiB, as nvidia-smi shows).

The latencies are not in any datasheet: they are the course's assumption (5 us per ring step inside a node,
20 us across, `ALPHA_NVLINK` and `ALPHA_NETWORK`), used for every GPU here and taken from here by lesson 11 and
`fsdp_mini.course.scaling.h100_cluster`; at the message sizes of FSDP units (hundreds of MB) they hardly matter.

For CPU offload each preset also names its host, nominal numbers (what a run reaches of them is
`step_time.PCIE_ACHIEVED` and `step_time.HOST_MEMORY_ACHIEVED`, assumptions):

* `pcie_bandwidth`: the GPU's PCIe x16 link to the host, one direction. Gen4 (A100): 16 GT/s x 16 lanes,
  "PCIe Gen4: 64 GB/s" both directions together in NVIDIA's A100 datasheet, 32 GB/s each way; Gen5 (every
  Hopper here): 32 GT/s, "PCIe Gen5: 128 GB/s" in the H100 and H200 datasheets, 64 GB/s each way (the
  128b/130b line code leaves 63).
* `host_memory_bandwidth`: the GPU's share of its socket's memory, since the optimizer step of every GPU's
  shard runs at once in the host's memory. These hosts have two sockets and four GPUs per socket. DGX A100
  (datasheet): 2 AMD EPYC 7742, 8 channels of DDR4-3200 each: 8 x 25.6 = 204.8 GB/s per socket, 51.2 per GPU.
  DGX H100 and DGX H200 (datasheets): 2 Intel Xeon Platinum 8480C (Sapphire Rapids, 8 DDR5 channels each),
  2 TB in 32 DIMMs: two per channel, at which Sapphire Rapids runs DDR5-4400 (4800 with one; Dell, "Memory
  Bandwidth for Next-Gen PowerEdge Servers ... Sapphire Rapids", 2023): 8 x 35.2 = 281.6 GB/s per socket,
  70.4 per GPU. Grand Teton's host is also two Sapphire Rapids sockets (OCP, "Grand Teton Intel-based CPU
  tray specification" v1.0); its DIMM count is not published, so it gets DGX H100's number.

Attention has its own peak, `attention_flops`: PyTorch's `scaled_dot_product_attention` runs FlashAttention-2
(its flash backend), whose kernels issue Ampere's `mma.sync` tensor-core instructions and none of Hopper's
(wgmma, TMA). Its authors measured what that reaches: "50-73% of the theoretical maximum FLOPs/s on A100"
(Dao, "FlashAttention-2", 2023, abstract) and "only 35% utilization on the H100 GPU" (Shah et al.,
"FlashAttention-3", 2024, abstract). The planner prices every tensor-core product at the same fitted
`MATMUL_FRACTION` (about the 73 % on A100), so on Hopper the peak FlashAttention-2 sees is the datasheet's
x 35 / 73 (`FA2_HOPPER_SHARE`): published measurements of the kernel, not fitted to any row here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from fsdp_mini.course.planner.json_file import read_json

__all__ = ["GPU", "GPUS", "get_gpu", "load_gpu", "GiB", "FA2_HOPPER_SHARE", "PCIE_GEN4_X16", "PCIE_GEN5_X16"]

GiB = 1024 ** 3
ALPHA_NVLINK = 5e-6
"""Seconds per ring step inside a node (the course's lesson 11 assumption)."""
ALPHA_NETWORK = 20e-6
"""Seconds per ring step across nodes (the course's lesson 11 assumption)."""
PCIE_GEN4_X16 = 32e9
"""Bytes/s one way over a PCIe Gen4 x16 link (NVIDIA A100 datasheet: 64 GB/s both ways)."""
PCIE_GEN5_X16 = 64e9
"""Bytes/s one way over a PCIe Gen5 x16 link (NVIDIA H100 and H200 datasheets: 128 GB/s both ways)."""
DDR4_3200_PER_GPU = 8 * 25.6e9 / 4
"""A DGX A100 socket's memory (8 channels of DDR4-3200) over the 4 GPUs it feeds."""
DDR5_4400_PER_GPU = 8 * 35.2e9 / 4
"""A DGX H100 socket's memory (8 channels of DDR5-4400, two DIMMs per channel) over the 4 GPUs it feeds."""
FA2_HOPPER_SHARE = 0.35 / 0.73
"""FlashAttention-2's share of a Hopper GPU's peak (35 %, FlashAttention-3 paper) over its share of an A100's
(73 %, FlashAttention-2 paper): the attention peak of a Hopper preset is its bf16 peak times this."""


@dataclass(frozen=True)
class GPU:
    """One accelerator and its links: FLOP/s, bytes, bytes/s (per direction), seconds."""

    name: str
    bf16_flops: float
    fp8_flops: float | None
    memory_bytes: int
    hbm_bandwidth: float
    nvlink_bandwidth: float
    network_bandwidth: float
    alpha_nvlink: float = ALPHA_NVLINK
    alpha_network: float = ALPHA_NETWORK
    attention_flops: float | None = None
    """The peak as FlashAttention-2 sees it (see the module's docstring); None: the bf16 peak."""
    pcie_bandwidth: float | None = None
    """Bytes/s one way over the GPU's PCIe link to its host (nominal); None: unknown, no CPU offload."""
    host_memory_bandwidth: float | None = None
    """Bytes/s of host memory per GPU: its socket's nominal bandwidth over the GPUs that socket feeds."""

    @property
    def attention_peak(self) -> float:
        return self.bf16_flops if self.attention_flops is None else self.attention_flops


GPUS: dict[str, GPU] = {g.name: g for g in (
    # NVIDIA A100 Tensor Core GPU datasheet (2021): bf16 312 TFLOP/s dense, 80 GB HBM2e at 2,039 GB/s
    # (SXM), NVLink 600 GB/s (both directions together); no fp8. Network: DGX A100 datasheet, 8 x 200 Gb/s
    # HDR InfiniBand (ConnectX-6) per 8 GPUs = 25 GB/s per GPU. torchtitan's docs/performance.md does not
    # name its A100 cluster's network: this is the DGX reference design, an assumption.
    GPU("a100-80gb", 312e12, None, 80 * 1024 ** 3, 2.039e12, 300e9, 25e9,
        pcie_bandwidth=PCIE_GEN4_X16, host_memory_bandwidth=DDR4_3200_PER_GPU),
    # The same datasheet's A100 40GB SXM column: bf16 312 TFLOP/s dense, 40 GB HBM2 at 1,555 GB/s, NVLink 600 GB/s,
    # PCIe Gen4; the DGX A100 320GB that first shipped it: 8 x 200 Gb/s HDR InfiniBand and 2 AMD EPYC 7742 as in the
    # 640GB system (DGX A100 datasheet). 40 GiB, as the 80 GB card holds 80 GiB (nvidia-smi: 40,960 MiB).
    GPU("a100-40gb", 312e12, None, 40 * 1024 ** 3, 1.555e12, 300e9, 25e9,
        pcie_bandwidth=PCIE_GEN4_X16, host_memory_bandwidth=DDR4_3200_PER_GPU),
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): bf16 989 TFLOP/s dense (1,979 with sparsity), fp8
    # 1,979 dense, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s; DGX H100: 8 x 400 Gb/s ConnectX-7 = 50 GB/s per GPU.
    GPU("h100-sxm", 989e12, 1979e12, 80 * 1024 ** 3, 3.35e12, 450e9, 50e9, attention_flops=989e12 * FA2_HOPPER_SHARE,
        pcie_bandwidth=PCIE_GEN5_X16, host_memory_bandwidth=DDR5_4400_PER_GPU),
    # Meta's Grand Teton H100 (torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md): "96GB HBM2e
    # with 2.4 TB/sec", NVLink all-to-all in a host of 8, "400 Gb/s per GPU" RDMA, 500 W power limit. Its tensor
    # cores' peak is unpublished: torchtitan's llama3_h100_202412 benchmark says "the actual peak TFLOPs number is
    # between SXM and NVL, and we don't know its exact value". The planner takes the H100 NVL's (NVIDIA H100
    # datasheet, NVL column: bf16 1,671 and fp8 3,341 TFLOP/s with sparsity, so 835 and 1,670 dense), the
    # conservative bound; the SXM's 989 is the other (up to 18 % faster products). MFU here divides by 835.
    GPU("h100-96gb", 835e12, 1670e12, 96 * 10 ** 9, 2.4e12, 450e9, 50e9, attention_flops=835e12 * FA2_HOPPER_SHARE,
        pcie_bandwidth=PCIE_GEN5_X16, host_memory_bandwidth=DDR5_4400_PER_GPU),
    # NVIDIA H200 datasheet: bf16 989 TFLOP/s, fp8 1,979 dense, 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s;
    # HGX H200 / DGX H200: 8 x 400 Gb/s per 8 GPUs = 50 GB/s per GPU.
    GPU("h200", 989e12, 1979e12, 141 * 10 ** 9, 4.8e12, 450e9, 50e9, attention_flops=989e12 * FA2_HOPPER_SHARE,
        pcie_bandwidth=PCIE_GEN5_X16, host_memory_bandwidth=DDR5_4400_PER_GPU),
)}


def get_gpu(name: str) -> GPU:
    """The preset called `name`; an unknown name is an error that names it and lists the presets."""
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; presets: {', '.join(GPUS)}") from None


def load_gpu(path: str | Path) -> GPU:
    """A GPU described in a JSON file with a preset's fields (`GPU`'s: FLOP/s, bytes, bytes/s, seconds; those with a
    default may be left out). An unknown field, a missing one, or a value that is not a positive number (or null
    where the field allows it) is an error that names it."""
    path = Path(path)
    spec = read_json(path, "GPU file")
    if not isinstance(spec, dict):
        raise ValueError(f"GPU file {str(path)!r} must hold a JSON object of GPU fields")
    fields = {f.name: f for f in dataclasses.fields(GPU)}
    unknown = sorted(set(spec) - set(fields))
    if unknown:
        raise ValueError(f"GPU file {str(path)!r}: unknown field {unknown[0]!r}; fields: {', '.join(fields)}")
    required = [name for name, f in fields.items() if f.default is dataclasses.MISSING]
    missing = [name for name in required if name not in spec]
    if missing:
        raise ValueError(f"GPU file {str(path)!r}: missing field {missing[0]!r}; required: {', '.join(required)}")
    for name, value in spec.items():
        if name == "name":
            if not isinstance(value, str) or not value:
                raise ValueError(f"GPU file {str(path)!r}: name={value!r} must be a non-empty string")
            continue
        nullable = name in ("fp8_flops", "attention_flops", "pcie_bandwidth", "host_memory_bandwidth")
        if value is None and nullable:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"GPU file {str(path)!r}: {name}={value!r} must be a positive number"
                             + (" or null" if nullable else ""))
    spec["memory_bytes"] = int(spec["memory_bytes"])
    return GPU(**spec)
