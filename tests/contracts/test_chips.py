"""The chip table MFU divides by: recorded H200 and H100 runs recompute to their own MFU from their
figures (model FLOPs per token x tokens/s over the table's dense bf16 peak) to 1%; torch's
device names map to the right row (PCIe and NVL before the generic name), unknown chips to
none; and each row's precisions differ.

    pytest tests/contracts/test_chips.py
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from bench.rows import mfu_fields
from bench.specs import job_precision
from tests.conftest import REPO
from wstrain.contracts.chips import CHIPS, Chip, chip, compute_precision, peak_flops
from wstrain.contracts.model_dims import PRESETS

# bench/runtime.py on an H200: Llama-3-8B dimensions with each row's `layers` layers, bf16
# (rows named *-mixed: mixed precision, computed in bf16), MFU over 989e12 FLOP/s then.
RECORDED = REPO / "bench/results/runtime/working-set-and-offload-baselines-h200-2026-11-22.json"


def _recorded_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(RECORDED.read_text())
    return [r for r in rows if r.get("mfu") is not None]


@pytest.mark.parametrize("row", _recorded_rows(), ids=lambda r: r["name"])
def test_recorded_h200_runs_recompute_to_their_mfu(row: dict[str, Any]) -> None:
    dims = replace(PRESETS["llama3-8b"], num_layers=row["layers"])
    precision = compute_precision(job_precision(row["name"]))
    assert precision == "bf16"
    found = peak_flops(row["gpu"], precision)
    assert found is not None, f"{row['gpu']} is not in the chip table"
    peak, source = found
    assert source == "H200"
    mfu = dims.flops_per_token(row["seq_len"]) * row["tokens_per_s"] / peak
    assert mfu == pytest.approx(row["mfu"], rel=0.01)
    # and the bench's own row fields say the same
    fields = mfu_fields(
        dims.flops_per_token(row["seq_len"]), row["tokens_per_s"], row["gpu"], "bf16"
    )
    assert fields == {"mfu": mfu, "precision": "bf16", "peak_flops": peak, "peak_source": "H200"}


# bench/runtime.py on an H100 SXM after the chip table: each row records its own precision,
# peak and source (`python -m bench.runtime --layers 4 --global-batch 8 --rows resident,ws-20`)
RECORDED_H100 = REPO / "bench/results/runtime/mfu-from-chip-table-h100-2026-11-25.json"


@pytest.mark.parametrize("row", json.loads(RECORDED_H100.read_text()), ids=lambda r: str(r["name"]))
def test_recorded_h100_runs_recompute_to_their_mfu(row: dict[str, Any]) -> None:
    dims = replace(PRESETS["llama3-8b"], num_layers=row["layers"])
    assert row["gpu"] == "NVIDIA H100 80GB HBM3" and row["precision"] == "bf16"
    found = peak_flops(row["gpu"], row["precision"])
    assert found == (row["peak_flops"], row["peak_source"]) == (989.4e12, "H100 SXM")
    mfu = dims.flops_per_token(row["seq_len"]) * row["tokens_per_s"] / found[0]
    assert mfu == pytest.approx(row["mfu"], rel=0.01)


def test_the_recorded_file_has_rows_to_check() -> None:
    rows = _recorded_rows()
    assert len(rows) >= 6 and any(r["name"].endswith("-mixed") for r in rows)


# torch.cuda.get_device_name() strings -> (row label, dense bf16 FLOP/s)
KNOWN = {
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 989.4e12),
    "NVIDIA H100": ("H100 SXM", 989.4e12),
    "NVIDIA H100 PCIe": ("H100 PCIe", 756e12),
    "NVIDIA H100 NVL": ("H100 NVL", 835.5e12),
    "NVIDIA H200": ("H200", 989.4e12),
    "NVIDIA H200 NVL": ("H200 NVL", 835.5e12),
    "NVIDIA A100-SXM4-80GB": ("A100 SXM", 312e12),
    "NVIDIA A100-SXM4-40GB": ("A100 SXM", 312e12),
    "NVIDIA A100 80GB PCIe": ("A100 PCIe", 312e12),
    "NVIDIA A100-PCIE-40GB": ("A100 PCIe", 312e12),
    "NVIDIA L40S": ("L40S", 362.05e12),
    "NVIDIA B200": ("B200", 2.25e15),
}
UNKNOWN = [
    "NVIDIA L40",  # not the L40S
    "NVIDIA GH200 480GB",  # not the H200
    "NVIDIA GB200",  # not the B200
    "NVIDIA GeForce RTX 4090",
    "AMD Instinct MI300X",
    "",
]


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_device_names_map_to_their_row(name: str) -> None:
    label, bf16 = KNOWN[name]
    assert peak_flops(name, "bf16") == (bf16, label)


@pytest.mark.parametrize("name", UNKNOWN)
def test_unknown_chips_have_no_peak(name: str) -> None:
    assert chip(name) is None
    assert peak_flops(name, "bf16") is None


def test_pcie_and_sxm_differ() -> None:
    sxm, pcie = peak_flops("NVIDIA H100 80GB HBM3", "bf16"), peak_flops("NVIDIA H100 PCIe", "bf16")
    assert sxm is not None and pcie is not None and pcie[0] < sxm[0]
    assert peak_flops("NVIDIA H100 PCIe", "fp32") == (51.2e12, "H100 PCIe")
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp32") == (66.9e12, "H100 SXM")


def test_every_row_is_reachable_and_sourced() -> None:
    """No row is shadowed by an earlier one, and each says where its numbers come from."""
    assert {label for label, _ in KNOWN.values()} == {c.label for c in CHIPS}
    for c in CHIPS:
        assert c.source.startswith("NVIDIA"), c.label


@pytest.mark.parametrize("c", CHIPS, ids=lambda c: c.label)
def test_precisions_differ(c: Chip) -> None:
    """Dense tensor-core bf16 is twice TF32 on every row, and FP32 on the CUDA cores is below
    both."""
    assert c.peak_flops_per_s("bf16") > c.peak_flops_per_s("tf32") > c.peak_flops_per_s("fp32")
    assert c.peak_flops_per_s("bf16") == pytest.approx(2 * c.peak_flops_per_s("tf32"), rel=0.03)


def test_compute_precision_of_a_job() -> None:
    assert compute_precision("bf16") == "bf16"
    assert compute_precision("mixed") == "bf16"  # bf16 autocast over the fp32 master
    assert compute_precision("fp32") == "fp32"
    assert compute_precision("fp32", tf32_matmuls=True) == "tf32"
    assert compute_precision("mixed", tf32_matmuls=True) == "bf16"
    with pytest.raises(ValueError, match="unknown precision"):
        compute_precision("fp8")
