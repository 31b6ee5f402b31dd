"""The disk tier in real worker processes (`python -m wstrain.worker.main` on a job dir laid
out as the agent lays it out, a plan spilling layers' AdamW moments to `--spill-dir`):

- a worker SIGKILLed inside a spill write (WSTRAIN_FAULT_KILL_IN_SPILL_WRITE), restarted,
  resumes from its last checkpoint and ends at the weights of a run that never spilled;
- a clean exit removes the spill file;
- a disk budget too small for the plan's spill is refused naming budget.disk_gib;
- a spill directory too full for the file (a 64 KiB tmpfs) fails the worker at once, not
  retried, naming the directory, the bytes needed and free, and the fix.

    pytest tests/worker/test_spill_worker.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.tmpfs import small_fs
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import WorkerExit, WorkerMessage
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.worker.io import checkpoint
from wstrain.worker.runtime.working_set.spill import FAULT_KILL_IN_SPILL_WRITE_ENV, SPILL_FILE

STEPS, EVERY = 6, 2


def _spec(disk_gib: float) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "spill", "model": {"preset": "micro-llama"}, "data": {"kind": "synthetic"},
            "seq_len": 32, "global_batch": 4, "steps": STEPS, "precision": "fp32",
            "overrides": {"runtime": "working_set", "device": "cpu"},
            "budget": {"device_gib": 2.0, "host_gib": 2.0, "disk_gib": disk_gib},
            "checkpoint_every": EVERY, "keep_checkpoints": 1,
        }
    )  # fmt: skip


def _job_dir(root: Path, name: str, spilled: int, disk_gib: float = 1.0) -> Path:
    spec = _spec(disk_gib)
    plan = make_plan(spec, resolve_dims(spec.model), DEFAULT_PROFILE)
    assert plan.working_set is not None
    # the host AdamW in both runs (spilled layers update on the host): the same math
    update = {"spilled_layers": spilled, "optimizer": "host", "device_layers": 0}
    ws = plan.working_set.model_copy(update=update)
    plan = Plan.model_validate({**plan.model_dump(), "working_set": ws.model_dump()})
    job_dir = root / "state" / "jobs" / name
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(spec.model_dump_json())
    (job_dir / "plan.json").write_text(plan.model_dump_json())
    return job_dir


def _worker(
    job_dir: Path, spill_dir: Path, env: dict[str, str] | None = None
) -> tuple[int, list[WorkerMessage], str]:
    data = job_dir.parents[2] / "data"
    data.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "wstrain.worker.main", "--job-dir", str(job_dir)]
    argv += ["--data-roots", json.dumps([str(data)]), "--spill-dir", str(spill_dir)]
    argv += ["--threads", "1"]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120
    )
    messages = [WorkerMessage.model_validate_json(line) for line in proc.stdout.splitlines()]
    return proc.returncode, messages, proc.stderr


def _weights(job_dir: Path) -> dict[str, torch.Tensor]:
    last = checkpoint.latest(job_dir / "checkpoints")
    assert last is not None
    return load_file(str(last / "model.safetensors"))


def test_a_worker_killed_mid_spill_write_resumes_to_the_unspilled_weights(tmp_path: Path) -> None:
    code, _, err = _worker(_job_dir(tmp_path, "straight", 0), tmp_path / "spill-straight")
    assert code == WorkerExit.succeeded, err[-3000:]
    job_dir, spill_dir = _job_dir(tmp_path, "killed", 2), tmp_path / "spill"
    # 2 spilled layers: 2 writes a step's update; the 7th is step 3's (0-based) second,
    # after the checkpoint at step 2
    code, messages, err = _worker(job_dir, spill_dir, {FAULT_KILL_IN_SPILL_WRITE_ENV: "7"})
    assert code == -signal.SIGKILL, (code, err[-3000:])
    assert "fault injection: SIGKILL inside spill write 7" in err
    saved = [m.step for m in messages if m.kind == "checkpoint"]
    assert saved == [2], saved
    assert (spill_dir / SPILL_FILE).exists()  # a kill leaves it; the restart truncates it
    code, messages, err = _worker(job_dir, spill_dir)
    assert code == WorkerExit.succeeded, err[-3000:]
    assert messages[0].kind == "started" and messages[0].step == 2
    assert "spill file" in err and "2 layers" in err
    assert not (spill_dir / SPILL_FILE).exists()  # a clean exit removes it
    want, got = _weights(tmp_path / "state" / "jobs" / "straight"), _weights(job_dir)
    for name, w in want.items():
        assert float((got[name] - w).norm() / w.norm()) < 1e-5, name


def test_a_disk_budget_too_small_for_the_spill_is_refused(tmp_path: Path) -> None:
    job_dir = _job_dir(tmp_path, "small", 2, disk_gib=1e-6)  # 1073 bytes
    code, messages, err = _worker(job_dir, tmp_path / "spill")
    assert code == WorkerExit.out_of_memory, err[-3000:]
    error = [m for m in messages if m.kind == "error"][-1]
    assert error.message is not None
    assert "budget.disk_gib allows 1073 bytes" in error.message, error.message
    assert "room for 0 layers" in error.message and "raise budget.disk_gib" in error.message
    assert error.needs_gib == {"disk_gib": 0.5}
    assert not (tmp_path / "spill" / SPILL_FILE).exists()


def test_a_full_spill_disk_fails_the_worker_at_once_naming_the_fix(tmp_path: Path) -> None:
    job_dir = _job_dir(tmp_path, "full", 2)  # 1 GiB of disk budget: the plan is not the limit
    with small_fs(tmp_path / "disk", "64k") as disk:  # less than 2 layers' moments
        code, messages, err = _worker(job_dir, disk / "spill")
        assert list((disk / "spill").iterdir()) == []  # no partial file left behind
    assert code == WorkerExit.refused, err[-3000:]  # not retried: the agent fails the job
    error = [m for m in messages if m.kind == "error"][-1]
    assert error.message is not None
    assert f"no space for the spill file in {disk / 'spill'}" in error.message, error.message
    assert "it needs 163840 bytes" in error.message and "65536 bytes free" in error.message
    assert "--spill-dir at a larger local disk" in error.message and "not retried" in error.message
