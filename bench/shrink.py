"""Shrinking a ranged job at a checkpoint, the worker's side on a GPU, driven as the agent
drives it: the policy shrinks a running ranged job (policy/budgets.py, agent/scheduling.py;
the queue's side runs on a real Redis in tests/agent/test_shrink.py), the agent SIGTERMs its
worker, which stops at the next step boundary with a checkpoint, and the job restarts under
a plan made at the lower point of its range, resuming from that checkpoint. This bench
runs one ranged job so, beside the same job at the lower budget from start to end:

    python -m bench.shrink --layers 8 --seq 8192 --global-batch 8 --steps 8 \
        --high-gib 24 --low-gib 12 --out bench/results/queue/shrink-X.json

Each part is a real worker process (`python -m wstrain.worker.main` on a job dir, as the
agent lays it out). The row: tokens/s at each budget (the median step after each process's
first) beside the planner's prediction there, the step it was shrunk at, and how far its
final weights are from the straight run's (bf16: a different plan may order its sums
differently), with each part's stalls a step beside the planner's breakdown.
`--no-straight` leaves out the straight run (tokens/s only). `--device cpu` runs it on the
CPU (fp32), a smoke of the same path.

`--second-layers N`: a second ranged job (N layers, the same range, `--second-host-gib`)
arrives while this one runs at its max on a GPU the policy packs to `--gpu-gib` (default high
+ low / 2: room for both at their mins only). The queue's policy (policy/budgets.py
shrink_to_free) decides: it shrinks this job to its min (the row's `policy_shrink`; a
preemption fails the run). After the stop, the shrunk job and the second one run on the
GPU at once, each planned at half of it as the agent plans a packed job; the low part's
prediction is that shared plan's. On one H200 (128 GiB host: budgets 80 + 24 GiB):

    python -m bench.shrink --layers 16 --second-layers 4 --second-host-gib 24 --seq 8192 \
        --global-batch 8 --steps 7 --checkpoint-every 3 --high-gib 24 --low-gib 12 \
        --host-gib 80 --no-straight --out X.json

Time on one H200 at 16 layers (4.5 B parameters), `--steps 7 --checkpoint-every 3
--no-straight`: 334 s, of which the two workers' starts took 30 and 43 s (the second loads
the checkpoint) and each 27 GB checkpoint 25-46 s; with `--second-layers 4`, 300 s. The
straight run adds a third worker and its checkpoint: past one 600 s call at 16 layers, so
give it a call of its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from bench.specs import llama_spec
from bench.working_set import measured_node
from wstrain.contracts.calibration import GIB
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import WorkerExit, WorkerMessage
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.policy import BudgetPoint
from wstrain.policy.budgets import RangedJob, shrink_to_free
from wstrain.worker.io import checkpoint

log = logging.getLogger("bench.shrink")


def _ranged(
    args: argparse.Namespace, name: str = "shrink", layers: int = 0, steps: int = 0,
    host_gib: float = 0.0,
) -> JobSpec:  # fmt: skip
    """A ranged job on the working set: Llama-3-8B dims at `layers` (default --layers) in
    bf16, device budget low..high; on the CPU the micro Llama in fp32 (a smoke of the same
    path)."""
    overrides = {"runtime": "working_set", "device": args.device}
    steps, host_gib = steps or args.steps, host_gib or args.host_gib
    if args.device == "cuda":
        raw = llama_spec(
            name, layers or args.layers, args.seq, args.global_batch, steps, args.high_gib,
            host_gib, overrides,
        ).model_dump(mode="json", exclude_none=True)  # fmt: skip
    else:
        raw = {
            "name": name, "model": {"preset": "micro-llama"}, "data": {"kind": "synthetic"},
            "seq_len": args.seq, "global_batch": args.global_batch, "steps": steps,
            "precision": "fp32", "overrides": overrides,
        }  # fmt: skip
    raw["budget"] = {
        "device_gib": {"min": args.low_gib, "max": args.high_gib},
        "host_gib": host_gib,
    }
    raw["checkpoint_every"] = args.checkpoint_every
    raw["keep_checkpoints"] = 1  # 8B dims at 8 layers: ~17 GB a checkpoint, on a 64 GiB disk
    return JobSpec.model_validate(raw)


def _job_dir(root: Path, name: str, spec: JobSpec, plan: Plan) -> Path:
    """root/state/jobs/NAME, as an agent lays a job out, with spec.json and plan.json
    (written again for a restart)."""
    job_dir = root / "state" / "jobs" / name
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "spec.json").write_text(spec.model_dump_json())
    (job_dir / "plan.json").write_text(plan.model_dump_json())
    return job_dir


def _worker(
    job_dir: Path, stop_at_checkpoint: bool, part: str, starts: dict[str, float] | None = None
) -> tuple[int, list[WorkerMessage]]:
    """The worker of the job dir to its end, or (`stop_at_checkpoint`) SIGTERMed at its
    first periodic checkpoint, as the agent stops a job it shrinks; `starts[part]` gets the
    seconds until its first step began (the start, with a checkpoint's load). Its log goes
    to job_dir/worker-PART.log (a pipe left unread would stall a chatty worker); each of its
    messages is logged here as it comes, so a run stopped by a time limit shows how far
    each part got."""
    argv = [sys.executable, "-m", "wstrain.worker.main", "--job-dir", str(job_dir)]
    data = job_dir.parents[2] / "data"  # synthetic tokens: no file is read
    data.mkdir(exist_ok=True)
    argv += ["--data-roots", json.dumps([str(data)])]
    log_path = job_dir / f"worker-{part}.log"
    started = time.monotonic()
    log.info("%s: worker started", part)
    with open(log_path, "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        messages = []
        for line in proc.stdout:
            msg = WorkerMessage.model_validate_json(line)
            messages.append(msg)
            if starts is not None and msg.kind == "started":
                starts[part] = time.monotonic() - started
            log.info("%s: +%.0f s %s step %s", part, time.monotonic() - started, msg.kind, msg.step)
            if stop_at_checkpoint and msg.kind == "checkpoint":
                proc.send_signal(signal.SIGTERM)
                stop_at_checkpoint = False
        code = proc.wait()
    log.info("%s: worker exited %d after %.0f s", part, code, time.monotonic() - started)
    if code not in (WorkerExit.succeeded, WorkerExit.cancelled):
        sys.stderr.write(log_path.read_text()[-4000:])
    return code, messages


def _tokens_per_s(messages: list[WorkerMessage], first_step: int) -> float | None:
    """The median reported step's tokens/s past the process's first step (its warm-up);
    None when none was reported (the worker reports at most every 0.2 s)."""
    rates = [m.tokens_per_s for m in messages if m.kind == "step" and (m.step or 0) > first_step]
    known = [r for r in rates if r is not None]
    return statistics.median(known) if known else None


def _stalls_per_step(messages: list[WorkerMessage], first_step: int) -> dict[str, float]:
    """Each stall reason's seconds a step over the steps _tokens_per_s reads, from the
    workers' cumulative totals (the first report past `first_step` back to `first_step`'s)."""
    steps = [m for m in messages if m.kind == "step" and (m.step or 0) >= first_step]
    if len(steps) < 2:
        return {}
    a, b = steps[0], steps[-1]
    n = (b.step or 0) - (a.step or 0)
    prefix = "stall_seconds_total."
    return {
        k.removeprefix(prefix): (v - a.metrics.get(k, 0.0)) / n
        for k, v in b.metrics.items()
        if k.startswith(prefix)
    }


def _weights(job_dir: Path) -> dict[str, torch.Tensor]:
    last = checkpoint.latest(job_dir / "checkpoints")
    assert last is not None, f"{job_dir}: no checkpoint"
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(last.glob("*.safetensors")):  # one file, or shards past 2 GiB
        weights.update(load_file(str(shard)))
    return weights


def _keep_weights_only(job_dir: Path) -> None:
    """Delete all but the weights of the job's last checkpoint (what _weights reads)."""
    last = checkpoint.latest(job_dir / "checkpoints")
    assert last is not None, f"{job_dir}: no checkpoint"
    for f in last.iterdir():
        if f.suffix != ".safetensors":
            f.unlink()


def _policy_shrink(args: argparse.Namespace, plans: dict[str, Plan]) -> str:
    """What the queue's policy does when the second job arrives at its min on a GPU of
    --gpu-gib held by this job at its max (policy/budgets.py shrink_to_free, as
    agent/scheduling.py asks it): the move it makes, which must be this job to its min
    (None would mean a preemption)."""
    tokens = args.global_batch * args.seq

    def point(gib: float, plan: Plan) -> BudgetPoint:
        return BudgetPoint(
            int(gib * GIB), int(args.host_gib * GIB), tokens / plan.predicted.step_seconds
        )

    job = RangedJob(
        "shrunk", 1.0, (point(args.low_gib, plans["low"]), point(args.high_gib, plans["high"]))
    )
    free_bytes = int((args.gpu_gib - args.high_gib) * GIB)
    moves = shrink_to_free([(job, 1)], int(args.low_gib * GIB) - free_bytes, 0)
    assert moves and moves[0].to == job.points[0], f"the policy did not shrink the job: {moves}"
    return (
        f"{args.high_gib:g} -> {args.low_gib:g} GiB, freeing {moves[0].freed_device_bytes / GIB:g}"
        f" GiB for the second job's {args.low_gib:g} on a {args.gpu_gib:g} GiB GPU"
    )


def _at_end_only(spec: JobSpec) -> JobSpec:
    """The job checkpointed at its end only (and at a stop)."""
    return spec.model_copy(update={"checkpoint_every": 0})


def _both(
    parts: list[tuple[Path, str]], starts: dict[str, float]
) -> list[tuple[int, list[WorkerMessage]]]:
    """Workers of these job dirs at once, to their ends (two jobs sharing the GPU)."""
    with ThreadPoolExecutor(len(parts)) as pool:
        return list(pool.map(lambda p: _worker(p[0], False, p[1], starts), parts))


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = _ranged(args)
    dims = resolve_dims(spec.model)
    # as the agent plans it (agent/launch.py): the node's profile with the job's own layer
    # timed on this GPU; without that layer the plans' compute came out 4% short at 8 layers
    node = measured_node(args.seq, dims) if args.device == "cuda" else DEFAULT_PROFILE
    at = {"high": spec.choosing(args.high_gib, args.host_gib)}
    at["low"] = spec.choosing(args.low_gib, args.host_gib)
    plans = {name: make_plan(s, dims, node) for name, s in at.items()}
    # after the shrink, with a second job, the GPU is shared: each planned at half of it,
    # as the agent plans a packed job (agent/launch.py, NodeProfile.shared_by)
    shared = node.shared_by(2) if args.second_layers else node
    low_plan = make_plan(at["low"], dims, shared) if args.second_layers else plans["low"]
    tokens = args.global_batch * args.seq
    root = Path(tempfile.mkdtemp(prefix="bench-shrink-"))
    straight: list[WorkerMessage] = []
    second: list[WorkerMessage] = []
    row: dict[str, Any] = {}
    err = None
    try:
        if args.second_layers:
            row["policy_shrink"] = _policy_shrink(args, plans)
        # at the high point until its first checkpoint and a SIGTERM, then at the low one
        shrunk_dir = _job_dir(root, "shrunk", at["high"], plans["high"])
        starts: dict[str, float] = {}
        code, high = _worker(shrunk_dir, True, "high", starts)
        assert code == WorkerExit.cancelled, f"the high part exited {code}, not stopped (3)"
        stopped = max(m.step or 0 for m in high if m.kind == "checkpoint")
        if args.second_layers:
            # both parts beside each other checkpoint at their ends only: the cadence moves no
            # byte of the math, and periodic 8B-dims checkpoints (27 GB at 16 layers, 11.5 GB
            # at 4) of both jobs at once overflow the GPU machine's 64 GiB disk
            _job_dir(root, "shrunk", _at_end_only(at["low"]), low_plan)
            # the second job, at its min beside the shrunk one, runs at least as long (its
            # steps from the plans' predictions and the high part's start, with 50% to
            # spare), so every step of the shrunk job's low part is measured sharing the GPU
            # (the low part's own start, loading the checkpoint, took 42 s at 16 layers). On
            # the CPU the start is left out: micro models' planned steps of 3 ms would make
            # it 1,442 steps
            start_s = starts["high"] if args.device == "cuda" else 0.0
            low_s = start_s + (args.steps - stopped) * low_plan.predicted.step_seconds
            probe = _ranged(args, "second", args.second_layers, 1, args.second_host_gib)
            b_spec = probe.choosing(args.low_gib, args.second_host_gib)
            b_dims = resolve_dims(b_spec.model)
            b_step_s = make_plan(b_spec, b_dims, shared).predicted.step_seconds
            b_steps = max(args.steps, math.ceil(1.5 * low_s / b_step_s) + 2)
            b_spec = _ranged(args, "second", args.second_layers, b_steps, args.second_host_gib)
            b_spec = _at_end_only(b_spec.choosing(args.low_gib, args.second_host_gib))
            b_plan = make_plan(b_spec, b_dims, shared)
            b_dir = _job_dir(root, "second", b_spec, b_plan)
            (code, low), (b_code, second) = _both([(shrunk_dir, "low"), (b_dir, "second")], starts)
            assert b_code == WorkerExit.succeeded, f"the second job exited {b_code}"
            row["second_layers"], row["second_steps"] = b_dims.num_layers, b_steps
            row["second_final_loss"] = [m.loss for m in second if m.kind == "step"][-1]
        else:
            _job_dir(root, "shrunk", at["low"], low_plan)
            code, low = _worker(shrunk_dir, False, "low")
        assert code == WorkerExit.succeeded, f"the low part exited {code}"
        if not args.no_straight:
            _keep_weights_only(shrunk_dir)
            # the same job at the low point from start to end, checkpointed at its end only:
            # the cadence moves no bytes of the math, and the disk then holds one checkpoint
            # beside the shrunk run's weights (8B dims at 16 layers: 27 GB a checkpoint, 9 GB of
            # weights, on the GPU machine's 64 GiB disk, where a periodic one beside them
            # filled it)
            once = _at_end_only(at["low"])
            straight_dir = _job_dir(root, "straight", once, plans["low"])
            code, straight = _worker(straight_dir, False, "straight")
            assert code == WorkerExit.succeeded, f"straight run exited {code}"
            a, b = _weights(shrunk_dir), _weights(straight_dir)
            err = max(float((a[k].float() - b[k].float()).norm() / b[k].float().norm()) for k in b)
    finally:  # checkpoints of 9-27 GB on the GPU machine's 64 GiB disk
        shutil.rmtree(root, ignore_errors=True)
    row |= {
        "bench": "shrink",
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "layers": dims.num_layers, "params": dims.params, "seq_len": args.seq,
        "global_batch": args.global_batch, "steps": args.steps,
        "high_gib": args.high_gib, "low_gib": args.low_gib, "host_gib": args.host_gib,
        "shrunk_at_step": stopped,
        "start_s": starts,
        "weights_rel_err_max": err,
        "final_loss": [m.loss for m in low if m.kind == "step"][-1],
        "straight_final_loss": next((m.loss for m in reversed(straight) if m.kind == "step"), None),
        "budget_violations": 0,  # a worker past a budget exits 5, asserted above
        "commit": os.environ.get("BENCH_COMMIT", ""),
    }  # fmt: skip
    for name, msgs, plan, first, n in (
        ("high", high, plans["high"], 1, tokens),
        ("low", low, low_plan, stopped + 1, tokens),
        ("straight_low", straight, plans["low"], 1, tokens),
    ):
        if not msgs:  # --no-straight
            continue
        measured = _tokens_per_s(msgs, first)
        predicted = n / plan.predicted.step_seconds
        row[f"tokens_per_s_{name}"] = measured
        row[f"predicted_tokens_per_s_{name}"] = predicted
        row[f"measured_over_predicted_{name}"] = measured / predicted if measured else None
        # where the time went, beside the planner's breakdown of its step
        row[f"stalls_s_{name}"] = _stalls_per_step(msgs, first)
        row[f"predicted_{name}"] = plan.predicted.model_dump()
    if second:  # its tokens/s as it ran beside the shrunk job (its first step its warm-up)
        row["tokens_per_s_second"] = _tokens_per_s(second, 1)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--checkpoint-every", type=int, default=3)
    p.add_argument("--high-gib", type=float, default=24.0)
    p.add_argument("--low-gib", type=float, default=12.0)
    p.add_argument("--host-gib", type=float, default=100.0)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument(
        "--second-layers", type=int, default=0,
        help="a second ranged job of this many layers arrives: the policy shrinks this one "
        "for it, and both run on the GPU (0: none)",
    )  # fmt: skip
    p.add_argument(
        "--gpu-gib", type=float, default=0.0,
        help="the GPU memory the policy packs into (default: high + low / 2, too little for "
        "both jobs but at their mins)",
    )  # fmt: skip
    p.add_argument("--second-host-gib", type=float, default=24.0)
    p.add_argument(
        "--no-straight", action="store_true",
        help="no run at the low point from start to end: tokens/s only, no weights check",
    )  # fmt: skip
    p.add_argument("--out")
    args = p.parse_args()
    args.gpu_gib = args.gpu_gib or args.high_gib + args.low_gib / 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    row = run(args)
    print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps([row], indent=1))


if __name__ == "__main__":
    main()
