"""A worker refuses a spec whose data leads into the state dir, before training, with its own
exit code (WorkerExit.refused, which its agent fails at once, with no retry: tests/e2e/
test_refusals.py) and an error naming the field; a data-parallel gang on CPU (gloo) ends
refused too, whichever of its ranks is refused first, and leaves no process behind.

    pytest tests/worker/test_refusal.py
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_spec
from tests.worker.forked import spawn
from tests.worker.launch import worker_argv, write_job
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import WorkerExit, WorkerMessage
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan

MARKER = "WSTRAIN-WORKER-REFUSAL-5d2e"


def _gang_pids(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "-s", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


@pytest.mark.parametrize("gpus", [1, 2])  # a gang: its ranks race to refuse
def test_data_linked_into_the_state_dir_is_refused_before_training(
    tmp_path: Path, gpus: int
) -> None:
    # the job dir is tmp/state/jobs/job-1: the worker's state dir is tmp/state
    (tmp_path / "state").mkdir()
    secret = tmp_path / "state" / "secret.txt"
    secret.write_text(f"{MARKER} another job's data\n" * 200)
    data = tmp_path / "data.txt"
    data.symlink_to(secret)  # under a data root (tmp), leading into the state dir
    spec = JobSpec.model_validate(
        tiny_spec(
            "refused",
            gpus=gpus,
            data={"kind": "text", "path": str(data), "tokenizer": "byte"},
            overrides={"micro_batch": 1},
        )
    )
    plan = make_plan(spec, resolve_dims(spec.model), DEFAULT_PROFILE)
    job_dir = write_job(tmp_path, spec, plan)
    with open(job_dir / "worker.log", "w") as log:
        # forked as an agent forks it (tests/worker/forked.py): its own session, which its
        # ranks share
        proc = spawn(worker_argv(job_dir), stderr=log)
    out, _ = proc.communicate(timeout=120)
    msgs = [WorkerMessage.model_validate_json(x) for x in out.splitlines()]
    logged = (job_dir / "worker.log").read_text()[-3000:]
    assert proc.returncode == WorkerExit.refused, logged
    assert not any(m.kind == "step" for m in msgs)  # refused before training
    errors = [m.message or "" for m in msgs if m.kind == "error"]
    assert len(errors) == 1 and "not retried" in errors[0], errors
    if gpus == 1:  # a gang's error may come from the rank that was refused first
        assert "data.path" in errors[0] and "state dir" in errors[0], errors
    assert MARKER not in out
    deadline = time.monotonic() + 10  # SIGKILLed ranks leave the session as they are reaped
    while _gang_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gang_pids(proc.pid) == []
