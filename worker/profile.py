"""A quick hardware profile of this host, printed as JSON for the scheduler agent.

    python -m worker.profile            # ~1 s on a CPU host

Measures practical matmul FLOP/s and AdamW parameter updates per second on the device the
jobs will use, and lists the GPUs. The autoconfigurator issue extends it (PCIe bandwidth,
attention throughput); the keys here stay.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

# bf16 dense peak of an H100/H200, the MFU denominator AdaWS uses.
HOPPER_PEAK_FLOPS = 989e12


def _time(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def profile() -> dict[str, object]:
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    n, dtype = (8192, torch.bfloat16) if cuda else (512, torch.float32)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    matmul_s = _time(lambda: a @ b, 10)
    p = torch.nn.Parameter(torch.randn(1 << 20))
    p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW([p])
    opt_s = _time(opt.step, 5)
    gpus = []
    if cuda:
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            gpus.append({"index": i, "name": torch.cuda.get_device_name(i),
                         "total_bytes": total, "free_bytes": free})
    matmul_flops = 2 * n**3 / matmul_s
    return {
        "device": "cuda" if cuda else "cpu",
        "gpus": gpus,
        "profile": {
            "matmul_flops": matmul_flops,
            "optimizer_params_per_s": p.numel() / opt_s,
            "peak_flops": HOPPER_PEAK_FLOPS if cuda else matmul_flops,
            "cpu_threads": float(torch.get_num_threads()),
            "host_cpus": float(os.cpu_count() or 1),
        },
    }


if __name__ == "__main__":
    json.dump(profile(), sys.stdout)
    sys.stdout.write("\n")
