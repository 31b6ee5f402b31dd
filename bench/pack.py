"""Two working-set jobs packed on one GPU against one alone: the `pack-2x20` row of issue 21.

Each job is `bench.runtime`'s `ws-20` row (Llama-3-8B dimensions under a 20 GiB device
budget, the allocator's hard limit) in its own process, as the agent runs workers; the
packed pair plans with half the GPU and half its link each (NodeProfile.shared_by(2)), as the
agent plans a job placed beside another. Reports each job's tokens/s, their sum, and the
sum over the lone job's.

    python -m bench.pack --layers 16 --global-batch 16 --out bench/results/pack.json

A lent machine has 125 GiB of host memory: two 16-layer jobs at 32 sequences a step need
~67 GiB each, so the measured pair trains 16 sequences a step (--global-batch), which each
row records.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROW = "ws-20"


def _child(layers: int, seq: int, batch: int, steps: int, jobs: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.runtime",
        "--row",
        ROW,
        "--layers",
        str(layers),
        "--seq",
        str(seq),
        "--global-batch",
        str(batch),
        "--steps",
        str(steps),
        "--jobs-on-gpu",
        str(jobs),
    ]


def run(argvs: list[list[str]]) -> list[dict[str, object]]:
    """Start every child at once; each prints its row as its last stdout line."""
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    procs = [
        subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for a in argvs
    ]
    rows = []
    for proc in procs:
        out, err = proc.communicate()
        sys.stderr.write(err[-1500:])
        if proc.returncode != 0:
            raise SystemExit(f"a packed job failed (exit {proc.returncode}): {err[-500:]}")
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=4, help="1 warm-up + timed steps")
    p.add_argument("--out")
    args = p.parse_args()
    shape = (args.layers, args.seq, args.global_batch, args.steps)
    start = time.time()
    (alone,) = run([_child(*shape, jobs=1)])
    pair = run([_child(*shape, jobs=2), _child(*shape, jobs=2)])
    summed = sum(float(r["tokens_per_s"]) for r in pair)  # type: ignore[arg-type]
    rows = [
        {**alone, "name": "pack-1x20", "packed_jobs": 1},
        *({**r, "name": "pack-2x20", "packed_jobs": 2, "job": i} for i, r in enumerate(pair)),
        {
            "name": "pack-2x20-sum",
            "layers": args.layers,
            "tokens_per_s": summed,
            "over_alone": summed / float(alone["tokens_per_s"]),  # type: ignore[arg-type]
            "wall_s": time.time() - start,
        },
    ]
    for r in rows:
        print(f"{r['name']:<14} {float(r['tokens_per_s']):>9.0f} tok/s", flush=True)  # type: ignore[arg-type]
    print(f"pair / alone: {rows[-1]['over_alone']:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
