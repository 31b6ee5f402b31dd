"""Where a step's GPU time goes: one training step under the PyTorch profiler (CUDA activity
only), summarised from its Chrome trace — how long kernels kept the GPU busy, what kind of
kernels (GEMM, attention, the rest), how long the two directions of PCIe copies ran, and the
idle gaps between kernels. It separates "the runtime waits" from "the runtime computes more"
when a working-set row is slower than resident.

    summary = profile_step(lambda: rt.train_step(data, i))   # inside a benchmark child

Needs a GPU; bench/runtime.py calls it for `--profile` rows.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

GAP_S = 1e-3  # idle stretches shorter than this are launch gaps, not stalls
TOP = 30  # kernels named in the summary, by total time
GAPS = 48  # idle stretches described by what ran around them


def kernel_kind(name: str) -> str:
    low = name.lower()
    if "flash" in low or "fmha" in low or "attention" in low:
        return "attention"
    if any(k in low for k in ("gemm", "cutlass", "xmma", "nvjet", "matmul")):
        return "gemm"
    return "other"


def _union_s(spans: list[tuple[float, float]]) -> tuple[float, list[tuple[float, float]]]:
    """Total covered time (s) and the gaps between covered stretches as (start, end) µs."""
    busy, gaps, end = 0.0, [], None
    for s, e in sorted(spans):
        if end is None or s > end:
            if end is not None:
                gaps.append((end, s))
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy / 1e6, gaps


def _gap_context(
    gap: tuple[float, float],
    kernels: list[tuple[float, float, str]],
    copies: list[tuple[float, float, str]],
    t0: float,
) -> dict[str, object]:
    """What ran around one idle stretch: the kernels that ended before and started after
    it, and the copies in flight during it (names cut to 60 characters)."""
    start, end = gap
    before = max((k for k in kernels if k[1] <= start), key=lambda k: k[1], default=None)
    after = min((k for k in kernels if k[0] >= end), key=lambda k: k[0], default=None)
    return {
        "ms": (end - start) / 1e3,
        "at_s": (start - t0) / 1e6,
        "before": before[2][:60] if before else None,
        "after": after[2][:60] if after else None,
        "copies": sorted({c[2][:30] for c in copies if c[0] < end and c[1] > start}),
    }


def summarise(trace: dict) -> dict[str, object]:
    """Busy, idle and copy seconds of a Chrome trace's GPU events."""
    kernels: list[tuple[float, float, str]] = []
    memcpys: list[tuple[float, float, str]] = []
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    copies = {"h2d": 0.0, "d2h": 0.0}
    for ev in trace.get("traceEvents", []):
        cat, dur = ev.get("cat", ""), float(ev.get("dur", 0.0))
        if cat == "kernel":
            kernels.append((float(ev["ts"]), float(ev["ts"]) + dur, ev.get("name", "")))
            kind = kernel_kind(ev.get("name", ""))
            by_kind[kind] = by_kind.get(kind, 0.0) + dur / 1e6
            name = ev.get("name", "")[:120]
            by_name[name] = by_name.get(name, 0.0) + dur / 1e6
        elif cat == "gpu_memcpy":
            name = ev.get("name", "")
            memcpys.append((float(ev["ts"]), float(ev["ts"]) + dur, name))
            if "HtoD" in name:
                copies["h2d"] += dur / 1e6
            elif "DtoH" in name:
                copies["d2h"] += dur / 1e6
    if not kernels:
        return {"kernels": 0}
    busy_s, gaps = _union_s([(s, e) for s, e, _ in kernels])
    t0 = min(s for s, _, _ in kernels)
    wall_s = (max(e for _, e, _ in kernels) - t0) / 1e6
    stalls = sorted(
        (g for g in gaps if g[1] - g[0] >= GAP_S * 1e6), key=lambda g: g[0] - g[1]
    )  # longest first
    stall_s = [(e - s) / 1e6 for s, e in stalls]
    return {
        "kernels": len(kernels),
        "wall_s": wall_s,
        "kernel_busy_s": busy_s,
        "busy_share": busy_s / wall_s,
        "kernel_s_by_kind": by_kind,
        "copy_s": copies,
        "idle_s": wall_s - busy_s,
        "gaps_over_1ms_s": sum(stall_s),
        "gaps_over_1ms": len(stalls),
        "largest_gaps_ms": [g * 1e3 for g in stall_s[:10]],
        "largest_gaps": [_gap_context(g, kernels, memcpys, t0) for g in stalls[:GAPS]],
        "top_kernels_s": dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:TOP]),
    }


def profile_step(step: Callable[[], object]) -> dict[str, object]:
    """Run `step` once under the profiler and summarise its GPU timeline."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return summarise(json.loads(path.read_text()))
