"""Host links under concurrency: each GPU's device-to-host and host-to-device copy rate into
page-locked memory, alone and with every GPU of the node copying at once — what a rank of a
data-parallel job gets while its peers stream too (bench/data_parallel.py's write-buffer
stall on 4 H100s). One thread per GPU, each copying its own buffer.

    python -m bench.concurrent_links --gib 1 --repeats 8 --out bench/results/X.json
"""

from __future__ import annotations

import argparse
import json
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
    start.wait()
    t0 = time.perf_counter()
    with torch.cuda.stream(stream):
        for _ in range(repeats):
            dst.copy_(src, non_blocking=True)
    stream.synchronize()
    return nbytes * repeats / (time.perf_counter() - t0)


def rates(gpus: list[int], direction: str, nbytes: int, repeats: int) -> list[float]:
    """Bytes/s each of `gpus` copies at while all of them copy at once."""
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--out")
    args = p.parse_args()
    nbytes, n = int(args.gib * 2**30), torch.cuda.device_count()
    rows = []
    for direction in ("d2h", "h2d"):
        for count in sorted({1, 2, n}):
            per_gpu = rates(list(range(count)), direction, nbytes, args.repeats)
            rows.append(
                {
                    "direction": direction,
                    "gpus": count,
                    "per_gpu_gb_s": [r / 1e9 for r in per_gpu],
                    "total_gb_s": sum(per_gpu) / 1e9,
                    "gpu": torch.cuda.get_device_name(0),
                }
            )
            each = [round(r / 1e9, 1) for r in per_gpu]
            print(f"{direction} {count} GPU(s) at once: {each} GB/s, total {sum(each):.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
