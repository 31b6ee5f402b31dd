"""Dense peak FLOP/s of known accelerators by compute precision: what MFU divides by.

    from wstrain.contracts.chips import compute_precision, peak_flops
    peak_flops("NVIDIA H100 80GB HBM3", compute_precision("mixed"))  # (989.4e12, "H100 SXM")

MFU = model FLOPs per token (ModelDims.flops_per_token: 6 x active parameters + attention)
x tokens/s / the chip's dense peak for the precision its matmuls run in. NVIDIA's datasheets
print tensor-core rates with 2:4 structured sparsity (marked *), twice what dense training
can reach; every number here is the dense one, each row with where it comes from. A chip not
in the table gets no row (None): the worker then divides by a measured GEMM rate instead and
says so. Rows match `torch.cuda.get_device_name()`; the first match wins, so a PCIe or NVL
variant comes before its family's generic name. GPU_NAMES and BOARDS give the rows the
names `wstrain plan --gpu` takes and the memory and host link of their cards, from which
contracts/hardware.py builds the profile a plan for a chip no node has uses. Standard
library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Final, Literal

# What a job's matmuls compute in: bf16 (precision bf16, and mixed under bf16 autocast), tf32
# (fp32 tensors with TF32 tensor-core matmuls allowed) or fp32.
ComputePrecision = Literal["bf16", "tf32", "fp32"]


@dataclass(frozen=True)
class Chip:
    label: str  # the name a peak is reported under ("H100 SXM")
    pattern: str  # regular expression searched in torch.cuda.get_device_name(), any case
    bf16_flops_per_s: float  # dense tensor-core BF16 with FP32 accumulate
    tf32_flops_per_s: float  # dense tensor-core TF32
    fp32_flops_per_s: float  # FP32 on the CUDA cores (no tensor cores)
    source: str

    def peak_flops_per_s(self, precision: ComputePrecision) -> float:
        return {
            "bf16": self.bf16_flops_per_s,
            "tf32": self.tf32_flops_per_s,
            "fp32": self.fp32_flops_per_s,
        }[precision]

    def matches(self, device_name: str) -> bool:
        return re.search(self.pattern, device_name, re.IGNORECASE) is not None


# \b keeps "GH200" off the H200 row and "GB200" off the B200 row: their clocks and power
# differ, so they stay unknown (measured) rather than borrow a neighbour's peak.
H100_SXM: Final = Chip(
    "H100 SXM",
    r"\bH100\b",  # "NVIDIA H100 80GB HBM3", "NVIDIA H100"
    989.4e12,
    494.7e12,
    66.9e12,
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), H100 SXM5 column "
    "(1978.9 BF16 / 989.4 TF32 TFLOPS with sparsity)",
)
H100_PCIE: Final = Chip(
    "H100 PCIe",
    r"\bH100\b.*\bPCIe\b",
    756e12,
    378e12,
    51.2e12,
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), H100 PCIe column "
    "(1513 BF16 / 756 TF32 TFLOPS with sparsity)",
)
H100_NVL: Final = Chip(
    "H100 NVL",
    r"\bH100 NVL\b",
    835.5e12,
    417.5e12,
    60e12,
    "NVIDIA H100 datasheet, H100 NVL column per GPU (1671 BF16 / 835 TF32 TFLOPS with "
    "sparsity, 60 FP32)",
)
H200: Final = replace(
    H100_SXM,
    label="H200",
    pattern=r"\bH200\b",
    source="NVIDIA H200 datasheet (989 BF16 dense, 67 FP32 TFLOPS): H100 SXM's GH100 "
    "silicon and clocks with HBM3e, so the H100 SXM whitepaper figures",
)
H200_NVL: Final = replace(
    H100_NVL,
    label="H200 NVL",
    pattern=r"\bH200 NVL\b",
    source="NVIDIA H200 datasheet, H200 NVL column (1671 BF16 / 835 TF32 TFLOPS with "
    "sparsity, 60 FP32): H100 NVL's figures",
)
A100_SXM: Final = Chip(
    "A100 SXM",
    r"\bA100\b",  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"
    312e12,
    156e12,
    19.5e12,
    "NVIDIA A100 datasheet (624 BF16 / 312 TF32 TFLOPS with sparsity, 19.5 FP32)",
)
A100_PCIE: Final = replace(
    A100_SXM,
    label="A100 PCIe",
    pattern=r"\bA100\b.*\bPCIe\b",  # "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB"
    source="NVIDIA A100 datasheet: the PCIe cards print the SXM figures",
)
L40S: Final = Chip(
    "L40S",
    r"\bL40S\b",
    362.05e12,
    183e12,
    91.6e12,
    "NVIDIA L40S datasheet (733 BF16 / 366 TF32 TFLOPS with sparsity, 91.6 FP32)",
)
B200: Final = Chip(
    "B200",
    r"\bB200\b",
    2.25e15,
    1.1e15,
    75e12,
    "NVIDIA HGX B200 specifications, per GPU (4.5 PFLOPS BF16 / 2.2 PFLOPS TF32 with "
    "sparsity, 75 TFLOPS FP32)",
)

# Variants before the generic row of their family: "NVIDIA H100 PCIe" also matches \bH100\b.
CHIPS: Final[tuple[Chip, ...]] = (
    H100_PCIE,
    H100_NVL,
    H100_SXM,
    H200_NVL,
    H200,
    A100_PCIE,
    A100_SXM,
    L40S,
    B200,
)


def compute_precision(job_precision: str, tf32_matmuls: bool = False) -> ComputePrecision:
    """What a job of JobSpec.precision `job_precision` multiplies in: bf16 and mixed (bf16
    autocast over the fp32 master) in bf16; fp32 in tf32 where the process allows TF32
    matmuls (torch.get_float32_matmul_precision() other than "highest"), else fp32."""
    if job_precision in ("bf16", "mixed"):
        return "bf16"
    if job_precision == "fp32":
        return "tf32" if tf32_matmuls else "fp32"
    raise ValueError(f"unknown precision {job_precision!r}: bf16, mixed or fp32")


def chip(device_name: str) -> Chip | None:
    """The table's row for a device name as torch reports it, or None for an unknown chip."""
    return next((c for c in CHIPS if c.matches(device_name)), None)


def peak_flops(device_name: str, precision: ComputePrecision) -> tuple[float, str] | None:
    """(dense peak FLOP/s, the row's label) of a known chip at `precision`; None if unknown."""
    found = chip(device_name)
    return None if found is None else (found.peak_flops_per_s(precision), found.label)


# ----------------------------------------------------------------- planning for a chip

# `wstrain plan --gpu NAME` (POST /v1/plans?gpu=NAME): the rows above by the short name a
# user types, the SXM board under the family's bare name (what "an H100" means in a cloud).
GpuName = Literal[
    "h100", "h100-pcie", "h100-nvl", "h200", "h200-nvl", "a100", "a100-pcie", "l40s", "b200"
]
GPU_NAMES: Final[dict[GpuName, Chip]] = {
    "h100": H100_SXM,
    "h100-pcie": H100_PCIE,
    "h100-nvl": H100_NVL,
    "h200": H200,
    "h200-nvl": H200_NVL,
    "a100": A100_SXM,
    "a100-pcie": A100_PCIE,
    "l40s": L40S,
    "b200": B200,
}


@dataclass(frozen=True)
class Board:
    """What a chip's card holds beside its FLOP/s, from its datasheet: memory, and the PCIe
    generation of its link to the host (which carries the working set's streams)."""

    memory_gib: int  # the datasheet's "80GB": HBM stacks of binary sizes, so GiB
    pcie_generation: int
    source: str


BOARDS: Final[dict[str, Board]] = {
    "H100 SXM": Board(80, 5, "NVIDIA H100 datasheet, SXM: 80 GB HBM3, PCIe Gen5"),
    "H100 PCIe": Board(80, 5, "NVIDIA H100 datasheet, PCIe: 80 GB HBM2e, PCIe Gen5"),
    "H100 NVL": Board(94, 5, "NVIDIA H100 datasheet, NVL: 94 GB HBM3, PCIe Gen5"),
    "H200": Board(141, 5, "NVIDIA H200 datasheet, SXM: 141 GB HBM3e, PCIe Gen5"),
    "H200 NVL": Board(141, 5, "NVIDIA H200 datasheet, NVL: 141 GB HBM3e, PCIe Gen5"),
    "A100 SXM": Board(80, 4, "NVIDIA A100 datasheet, SXM 80GB: HBM2e, PCIe Gen4"),
    "A100 PCIe": Board(80, 4, "NVIDIA A100 datasheet, PCIe 80GB: HBM2e, PCIe Gen4"),
    "L40S": Board(48, 4, "NVIDIA L40S datasheet: 48 GB GDDR6, PCIe Gen4 x16"),
    "B200": Board(180, 5, "NVIDIA HGX B200 specifications: 1.44 TB over 8 GPUs, PCIe Gen5"),
}
