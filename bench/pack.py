"""Working-set jobs packed on GPUs: two on one GPU against one alone (the `pack-2x20` row),
and a queue of jobs on a node's GPUs packed against one job a GPU in turn (`--queue`).

Each job is `bench.runtime`'s `ws-20` row (Llama-3-8B dimensions under a 20 GiB device
budget, the allocator's hard limit) in its own process, as the agent runs workers; the
packed pair plans with half the GPU and half its link each (NodeProfile.shared_by(2)), as the
agent plans a job placed beside another. Reports each job's tokens/s, their sum, and the
sum over the lone job's.

    python -m bench.pack --layers 16 --global-batch 16 --out bench/results/pack.json
    python -m bench.pack --queue 4 --gpus 2 --layers 16 --global-batch 8 --steps 6 --out X.json

The queue: `--queue` jobs, each the same `--steps` steps (its start, profile and checkpoint-
free load included, as a worker's), run first one a GPU in turn (a GPU takes the next job
when its job ends) and then all at once, `queue / gpus` a GPU; each reports the makespan and
jobs/hour (jobs over the makespan), the packed over the turns.

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
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Any

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


@dataclass
class Child:
    """A running job and the files its output goes to (a full pipe would stall a child the
    bench is not reading yet)."""

    proc: subprocess.Popen[bytes]
    out: IO[bytes]
    err: IO[bytes]

    def row(self) -> dict[str, Any]:
        """Its row, the last line it printed; a failed child stops the bench."""
        self.proc.wait()
        out, err = (_text(f) for f in (self.out, self.err))
        self.out.close()
        self.err.close()
        sys.stderr.write(err[-1500:])
        if self.proc.returncode != 0:
            raise SystemExit(f"a packed job failed (exit {self.proc.returncode}): {err[-500:]}")
        row: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return row


def _text(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def _start(argv: list[str], gpu: int | None = None) -> Child:
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    # the files outlive this call: the child writes them until row() reads and closes them
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
    return Child(subprocess.Popen(argv, stdout=out, stderr=err, env=env), out, err)


def run(argvs: list[list[str]]) -> list[dict[str, Any]]:
    """Start every child at once; each prints its row as its last stdout line."""
    return [child.row() for child in [_start(a) for a in argvs]]


def _drain(argv: list[str], slots: list[int], jobs: int) -> tuple[list[dict[str, Any]], float]:
    """Run `jobs` copies of `argv`, one a slot at a time (slots name GPUs, a GPU listed once
    per job it holds at once), a free slot taking the next: (their rows, the makespan)."""
    start = time.time()
    running: dict[int, Child] = {}  # slot -> its job
    done: list[dict[str, Any]] = []
    waiting = jobs
    while waiting or running:
        for k, gpu in enumerate(slots):
            if k not in running and waiting:
                waiting -= 1
                running[k] = _start(argv, gpu)
        time.sleep(0.5)
        for k, child in list(running.items()):
            if child.proc.poll() is not None:
                done.append({**child.row(), "gpu": slots[k], "end_s": time.time() - start})
                del running[k]
    return done, time.time() - start


def queue(shape: tuple[int, int, int, int], jobs: int, gpus: int) -> list[dict[str, Any]]:
    """`jobs` equal jobs on `gpus` GPUs: one a GPU in turn, then all packed at once."""
    share = -(-jobs // gpus)
    # the node profile measured once, alone, and cached for every job (as an agent does):
    # jobs starting together would otherwise time their links against each other
    warm = "from bench.working_set import measured_node; measured_node()"
    subprocess.run([sys.executable, "-c", warm], check=True)
    turns = _drain(_child(*shape, jobs=1), list(range(gpus)), jobs)
    packed = _drain(_child(*shape, jobs=share), [i % gpus for i in range(jobs)], jobs)
    rows: list[dict[str, Any]] = []
    for name, (each, makespan), per_gpu in (
        ("queue-turns", turns, 1),
        ("queue-packed", packed, share),
    ):
        rows += [{**r, "name": f"{name}-job", "job": i} for i, r in enumerate(each)]
        rows.append(
            {
                "name": name,
                "jobs": jobs,
                "gpus": gpus,
                "jobs_per_gpu": per_gpu,
                "makespan_s": makespan,
                "jobs_per_hour": jobs * 3600 / makespan,
            }
        )
    rows.append({"name": "queue-packed-over-turns", "ratio": turns[1] / packed[1]})
    for r in rows:
        if "makespan_s" in r:
            print(f"{r['name']:<14} {r['makespan_s']:>8.1f} s  {r['jobs_per_hour']:.1f} jobs/h")
    print(f"packed over turns: {rows[-1]['ratio']:.3f} (jobs/hour)")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=4, help="1 warm-up + timed steps")
    p.add_argument("--queue", type=int, default=0, help="jobs in the queue (0: the pair)")
    p.add_argument("--gpus", type=int, default=1, help="the queue's GPUs")
    p.add_argument("--out")
    args = p.parse_args()
    shape = (args.layers, args.seq, args.global_batch, args.steps)
    rows = queue(shape, args.queue, args.gpus) if args.queue else pair(shape, args.layers)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


def pair(shape: tuple[int, int, int, int], layers: int) -> list[dict[str, Any]]:
    """One job alone, then two at once on the same GPU, and their sum over the lone one."""
    start = time.time()
    (alone,) = run([_child(*shape, jobs=1)])
    both = run([_child(*shape, jobs=2), _child(*shape, jobs=2)])
    summed = sum(float(r["tokens_per_s"]) for r in both)
    rows = [
        {**alone, "name": "pack-1x20", "packed_jobs": 1},
        *({**r, "name": "pack-2x20", "packed_jobs": 2, "job": i} for i, r in enumerate(both)),
        {
            "name": "pack-2x20-sum",
            "layers": layers,
            "tokens_per_s": summed,
            "over_alone": summed / float(alone["tokens_per_s"]),
            "wall_s": time.time() - start,
        },
    ]
    for r in rows:
        print(f"{r['name']:<14} {float(r['tokens_per_s']):>9.0f} tok/s", flush=True)
    print(f"pair / alone: {rows[-1]['over_alone']:.3f}")
    return rows


if __name__ == "__main__":
    main()
