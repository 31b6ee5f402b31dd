"""Host links under concurrency: the copy rate each GPU of a node gets into or out of
page-locked host memory while several of them copy at once. Ranks of a data-parallel job
stream together, and on some hosts their device-to-host copies share a ceiling below the
sum of their links (4x H100: 55 GB/s a GPU alone or two at once, 34 GB/s each with four at
once; bench/RESULTS.md "Data parallel"), which the planner must give each rank.

    d2h_by_gpus(2 << 30, 10)   # {"d2h_bytes_per_s.2": ..., "d2h_bytes_per_s.4": ...}
    python -m bench.concurrent_links                 # both directions, as a table
"""

from __future__ import annotations

import threading
import time

import torch


def _copy_rate(
    gpu: int, direction: str, nbytes: int, repeats: int, start: threading.Barrier
) -> float:
    torch.cuda.set_device(gpu)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{gpu}")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src, dst = (dev, host) if direction == "d2h" else (host, dev)
    stream = torch.cuda.Stream(gpu)
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)  # warm-up
    stream.synchronize()
    start.wait()  # every GPU starts together
    t0 = time.perf_counter()
    with torch.cuda.stream(stream):
        for _ in range(repeats):
            dst.copy_(src, non_blocking=True)
    stream.synchronize()
    return nbytes * repeats / (time.perf_counter() - t0)


def copy_rates(gpus: list[int], direction: str, nbytes: int, repeats: int) -> list[float]:
    """Bytes/s each of `gpus` copies at ("d2h" or "h2d") while all of them copy at once,
    one thread a GPU."""
    out = [0.0] * len(gpus)
    start = threading.Barrier(len(gpus))

    def run(i: int) -> None:
        out[i] = _copy_rate(gpus[i], direction, nbytes, repeats, start)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(gpus))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def d2h_by_gpus(nbytes: int, repeats: int) -> dict[str, float]:
    """The slowest GPU's device-to-host rate with 2, 4, ... and all of the node's GPUs
    copying at once, as profile keys "d2h_bytes_per_s.<gpus>"; none on one GPU."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    counts = sorted({k for k in (2, 4, 8) if k < n} | ({n} if n > 1 else set()))
    return {
        f"d2h_bytes_per_s.{k}": min(copy_rates(list(range(k)), "d2h", nbytes, repeats))
        for k in counts
    }
