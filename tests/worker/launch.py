"""The worker process as its agent starts it, for the worker tests: a job dir holding the
spec and its plan (STATE/jobs/ID, as the agent lays it out), the command line, and a tiny
job of several ranks started, finished and its last checkpoint read.

    job_dir = write_job(tmp_path, spec, plan)
    subprocess.run(worker_argv(job_dir, "--threads", "1"))   # exec'd
    code, messages = finish(start(tiny_job_dir(tmp_path, 2, "working_set")))  # forked
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import load_file

from tests.conftest import REPO, tiny_spec
from tests.worker.forked import ForkedWorker, spawn
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import WorkerMessage
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.worker.io import checkpoint

STEPS = 6


def write_job(root: Path, spec: JobSpec, plan: Plan) -> Path:
    """root/state/jobs/job-1 with spec.json and plan.json."""
    job_dir = root / "state" / "jobs" / "job-1"
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(spec.model_dump_json())
    (job_dir / "plan.json").write_text(plan.model_dump_json())
    return job_dir


def worker_argv(job_dir: Path, *extra: str) -> list[str]:
    """`python -m wstrain.worker.main` of the job, one CPU thread, reading the repo (the
    shipped corpus) and the test's own directory."""
    roots = [str(REPO), str(job_dir.parents[2])]
    return [
        sys.executable,
        "-m",
        "wstrain.worker.main",
        "--job-dir",
        str(job_dir),
        "--threads",
        "1",
        "--data-roots",
        json.dumps(roots),
        *extra,
    ]


def tiny_job_dir(tmp_path: Path, gpus: int, runtime: str, steps: int = STEPS) -> Path:
    """The tiny job on `gpus` ranks of `runtime`, a micro-batch of one, a checkpoint every
    two steps, written under tmp_path/RUNTIME-GPUS."""
    spec = JobSpec.model_validate(
        tiny_spec(
            f"dp{gpus}",
            steps=steps,
            gpus=gpus,
            checkpoint_every=2,
            overrides={"runtime": runtime, "micro_batch": 1},
        )
    )
    plan = make_plan(spec, resolve_dims(spec.model), DEFAULT_PROFILE)
    assert plan.ranks == gpus and plan.rounds * plan.micro_batch * gpus == spec.global_batch
    return write_job(tmp_path / f"{runtime}-{gpus}", spec, plan)


def start(job_dir: Path) -> ForkedWorker:
    """The job's worker, forked from the test zygote (tests/worker/forked.py) as an agent
    forks it: its own session, which its ranks share; stderr to the job's worker.log."""
    with open(job_dir / "worker.log", "w") as log:
        return spawn(worker_argv(job_dir), stderr=log)


def finish(proc: ForkedWorker) -> tuple[int, list[WorkerMessage]]:
    """The worker's exit code and the messages it printed."""
    out, _ = proc.communicate(timeout=240)
    return proc.returncode, [WorkerMessage.model_validate_json(x) for x in out.splitlines()]


def last_weights(job_dir: Path) -> dict:  # type: ignore[type-arg]
    """The tensors of the job's latest checkpoint, every shard."""
    ckpt = checkpoint.latest(job_dir / "checkpoints")
    assert ckpt is not None
    out = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def assert_close(a: dict, b: dict) -> None:  # type: ignore[type-arg]
    """The same tensors, each within 1e-5 relative (fp32)."""
    assert a.keys() == b.keys()
    for name, w in b.items():
        err = float((a[name] - w).norm() / w.norm().clamp_min(1e-30))
        assert err < 1e-5, (name, err)
