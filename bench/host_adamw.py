"""Host AdamW throughput: torch's fused CPU AdamW on one Llama-3-8B layer's parameters
(218M, bf16 state as the working-set runtime keeps it) at several intra-op thread counts,
beside a plain copy's memory bandwidth. It is what worker/host_optim.py runs per layer.

    python -m bench.host_adamw --out bench/results/<file>.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

LAYER_PARAMS = 218_112_000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="4,8,12,15,16")
    p.add_argument("--out")
    args = p.parse_args()
    n = LAYER_PARAMS
    param = torch.nn.Parameter(torch.randn(n, dtype=torch.bfloat16) * 0.02)
    param.grad = torch.randn(n, dtype=torch.bfloat16) * 0.01
    opt = torch.optim.AdamW([param], lr=1e-4, fused=True)
    opt.step()  # allocate the moments
    src = torch.empty(n * 4, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults stay out of the timing
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dst.copy_(src)
        copy_s = time.perf_counter() - t0
        rows.append({"threads": threads, "adamw_s_per_layer": min(times),
                     "params_per_s": n / min(times),
                     "copy_bytes_per_s": 2 * src.numel() / copy_s})
        print(f"threads {threads:>2}: AdamW {min(times) * 1e3:6.1f} ms a layer "
              f"({n / min(times) / 1e9:.2f} G params/s), copy "
              f"{2 * src.numel() / copy_s / 1e9:.1f} GB/s read+write", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
