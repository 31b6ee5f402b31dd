"""Host links under concurrency: each GPU's device-to-host and host-to-device copy rate into
page-locked memory, alone and with every GPU of the node copying at once — what a rank of a
data-parallel job gets while its peers stream too (bench/data_parallel.py's write-buffer
stall on 4 H100s). One thread per GPU, each copying its own buffer
(worker/profile/shared_links.py, which the node profile also runs for D2H).

    python -m bench.concurrent_links --gib 1 --repeats 8 --out bench/results/X.json
"""

from __future__ import annotations

import argparse
import json

import torch

from wstrain.worker.profile.shared_links import copy_rates


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
            per_gpu = copy_rates(list(range(count)), direction, nbytes, args.repeats)
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
