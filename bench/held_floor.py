"""The kernel floor at the clocks a long step runs at: each of the step's kernels timed over a
held window of back-to-back calls, after as long a warm-up, instead of in a burst.

A burst of ten calls runs at the card's boost clock; a step that computes for minutes does
not. On the lent H200 (700 W cap) the SM clock read 1,980 MHz at 120 W before a 256K row and
1,470-1,650 MHz at 686-693 W through its steps, and the step's kernels ran at 0.85 of their
burst rates (bench/results/long-context/gpu-clocks-256k-and-32k-x8-h200-2026-11-29.json,
profile-32k-x8-fa3-h200-2026-11-29.json). The step's kernels alone, back to back, draw
at least the step's power, so the floor they set is timed the same way: the rate over the
second `hold_s` of calls, with nvidia-smi's SM clock and power sampled across it. The burst
floor stays in every row beside this one (bench/long_context.py).

    held = held_rate(lambda: a @ b, 2 * m * k * n, hold_s=10.0)
    held.flops_per_s, held.sm_mhz, held.power_w
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# nvidia-smi takes ~0.1 s to answer; a sample a second is ~10 over a 10 s window
SAMPLE_EVERY_S = 1.0
# a host sync between calls leaves the card idle; a call of a 1.3 ms GEMM waits ~20 us
# for it, so calls go in batches of at least this long between syncs
BATCH_S = 0.05
_FIELDS = ("--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class Held:
    flops_per_s: float  # over the timed window, after the warm-up
    calls: int
    seconds: float
    sm_mhz: float | None  # median of the samples across the timed window; None without them
    power_w: float | None


def gpu_sample() -> tuple[float, float] | None:
    """(SM clock MHz, power W) of this process's first GPU from nvidia-smi (which numbers
    the machine's GPUs, not CUDA_VISIBLE_DEVICES': its first entry, an index or a UUID,
    names the same card); None where nvidia-smi is absent or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run(
            ["nvidia-smi", "-i", gpu, *_FIELDS],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        mhz, watts = (float(x) for x in out.strip().splitlines()[0].split(","))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return mhz, watts


class _Sampler:
    """gpu_sample() every SAMPLE_EVERY_S on a thread until stopped."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            s = gpu_sample()
            if s is None:
                return
            self.samples.append(s)
            self._stop.wait(SAMPLE_EVERY_S)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _run_for(fn: Callable[[], object], seconds: float, batch: int) -> tuple[int, float]:
    """Calls of `fn`, `batch` between host syncs, until `seconds` have passed; (calls,
    seconds taken)."""
    calls, start = 0, time.perf_counter()
    while True:
        for _ in range(batch):
            fn()
        _sync()
        calls += batch
        took = time.perf_counter() - start
        if took >= seconds:
            return calls, took


def _batch(fn: Callable[[], object]) -> int:
    """Calls a batch: as many as last BATCH_S, one for a call longer than that (timed on
    a second call: the first pays the library's set-up)."""
    fn()
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
    return max(1, int(BATCH_S / max(time.perf_counter() - start, 1e-9)))


def held_rate(fn: Callable[[], object], flops_per_call: float, hold_s: float) -> Held:
    """`fn`'s FLOP/s held: calls for `hold_s` to bring the card to the clock a long run
    settles at, then calls for `hold_s` more, timed and sampled."""
    if hold_s <= 0:
        raise ValueError(f"hold_s={hold_s}: a held rate needs a window; pass seconds > 0")
    batch = _batch(fn)
    _run_for(fn, hold_s, batch)
    with _Sampler() as sampler:
        calls, took = _run_for(fn, hold_s, batch)
    mhz = [m for m, _ in sampler.samples]
    watts = [w for _, w in sampler.samples]
    return Held(
        flops_per_s=calls * flops_per_call / took,
        calls=calls,
        seconds=took,
        sm_mhz=statistics.median(mhz) if mhz else None,
        power_w=statistics.median(watts) if watts else None,
    )
