"""bench/timeline.py's trace summary on a hand-written Chrome trace (CPU, no profiler):
busy time is the union of overlapping kernels, gaps of 1 ms and more count as idle
stretches, copies are split by direction.

    pytest tests/bench/test_timeline.py
"""

from __future__ import annotations

import pytest

from bench.timeline import kernel_kind, summarise


def _kernel(name: str, ts_us: float, dur_us: float) -> dict[str, object]:
    return {"cat": "kernel", "name": name, "ts": ts_us, "dur": dur_us}


def test_summary_unions_overlaps_and_finds_gaps() -> None:
    trace = {
        "traceEvents": [
            _kernel("nvjet_sm90_tst_256x128_TNT", 0, 1000),
            _kernel("void at::native::vectorized_elementwise_kernel<8>", 500, 1000),  # overlaps
            _kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 4000, 2000),  # 2.5 ms gap
            _kernel("void at::native::reduce_kernel", 6200, 300),  # 0.2 ms: a launch gap
            {"cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 0, "dur": 3000},
            {"cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 100, "dur": 500},
            {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 99999},  # not GPU time
        ]
    }
    out = summarise(trace)
    assert out["kernels"] == 4
    assert out["wall_s"] == pytest.approx(6.5e-3)
    assert out["kernel_busy_s"] == pytest.approx((1500 + 2000 + 300) / 1e6)
    assert out["idle_s"] == pytest.approx((2500 + 200) / 1e6)
    assert out["gaps_over_1ms"] == 1 and out["gaps_over_1ms_s"] == pytest.approx(2.5e-3)
    assert out["copy_s"] == pytest.approx({"h2d": 3e-3, "d2h": 0.5e-3})
    kinds = out["kernel_s_by_kind"]
    assert kinds["gemm"] == pytest.approx(1e-3) and kinds["attention"] == pytest.approx(2e-3)
    assert kinds["other"] == pytest.approx(1.3e-3)
    assert next(iter(out["top_kernels_s"])).startswith("cudnn_generated")
    (gap,) = out["largest_gaps"]  # what ran around the 2.5 ms gap
    assert gap["ms"] == pytest.approx(2.5) and gap["at_s"] == pytest.approx(1.5e-3)
    assert gap["before"].startswith("void at::native::vectorized")
    assert gap["after"].startswith("cudnn_generated")
    assert gap["copies"] == ["Memcpy HtoD (Pinned -> Device)"]


def test_kernel_kinds_and_empty_trace() -> None:
    assert kernel_kind("sm90_xmma_gemm_bf16bf16") == "gemm"
    assert kernel_kind("flash_bwd_kernel") == "attention"
    assert kernel_kind("void at::native::silu_kernel") == "other"
    assert summarise({"traceEvents": []}) == {"kernels": 0}
