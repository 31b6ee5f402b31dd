"""Host AdamW throughput: the working-set runtime's own update of one Llama-3-8B layer
(218M parameters; `HostState.step_group` with torch's fused CPU AdamW, as working_set/host_optim.py
runs it) at several intra-op thread counts and precisions ("bf16": pure bf16 tiles; "mixed":
bf16 gradient widened into fp32, fp32 master and moments, master rounded into the bf16 weight
tile), beside a plain copy's memory bandwidth.

    python -m bench.host_adamw --out bench/results/<file>.json
    python -m bench.host_adamw --threads 2 --precisions bf16,mixed   # any CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import OptimizerSpec
from wstrain.worker.runtime.working_set.state import HostState

# one Llama-3-8B decoder layer, and a vocabulary too small to matter next to it
DIMS = dataclasses.replace(PRESETS["llama3-8b"], num_layers=1, vocab_size=256)


def copy_bytes_per_s(nbytes: int) -> float:
    """Read + write bandwidth of one plain copy of `nbytes` (after a first touch)."""
    src = torch.empty(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    dst.copy_(src)
    return 2 * nbytes / (time.perf_counter() - t0)


def update_s(host: HostState, spec: OptimizerSpec, repeats: int = 3) -> float:
    """The fastest of `repeats` updates of layer 0, clipped as a real step is."""
    host.step_group(0, spec.lr, 0.5, spec)  # the moments' first touch stays out of the timing
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        host.step_group(0, spec.lr, 0.5, spec)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="4,8,12,15,16")
    p.add_argument("--precisions", default="bf16,mixed")
    p.add_argument("--out")
    args = p.parse_args()
    spec = OptimizerSpec(lr=1e-4)
    n = DIMS.layer_params
    rows = []
    for precision in args.precisions.split(","):
        host = HostState.create(DIMS, precision, pin=False, fused_adamw=True)
        host.weights[0].normal_(0.0, 0.02)
        host.grads[0].normal_(0.0, 0.01)
        host.load_state_dict({k: v.clone() for k, v in host.weight_views().items()})
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            layer_s, copy_bps = update_s(host, spec), copy_bytes_per_s(4 * n)
            rows.append(
                {
                    "precision": precision,
                    "threads": threads,
                    "adamw_s_per_layer": layer_s,
                    "params_per_s": n / layer_s,
                    "copy_bytes_per_s": copy_bps,
                }
            )
            print(
                f"{precision:>5} threads {threads:>2}: AdamW {layer_s * 1e3:6.1f} ms a layer "
                f"({n / layer_s / 1e9:.2f} G params/s), copy {copy_bps / 1e9:.1f} GB/s "
                "read+write",
                flush=True,
            )
        del host
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
