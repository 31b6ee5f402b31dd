"""A data-parallel job through the worker process (worker/ranks.py, worker/main.py) on CPU
with gloo: `python -m wstrain.worker.main` of a 2-GPU plan starts its second rank, both
train, and the final checkpoint equals the one-GPU job's (fp32, 1e-5) on both runtimes; a
killed rank stops the gang at once (rank 0 reports it and exits failed, no process left);
SIGTERM stops every rank at one step with a checkpoint, from which the job resumes to the
uninterrupted job's weights.

    pytest tests/worker/test_ranks.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_spec
from tests.worker.launch import (
    STEPS,
    assert_close,
    finish,
    last_weights,
    start,
    tiny_job_dir,
    write_job,
)
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import WorkerExit, WorkerMessage
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan


def _gang_pids(pid: int) -> list[int]:
    """Processes of the session `pid` leads (rank 0 and the ranks it started)."""
    out = subprocess.run(["ps", "-o", "pid=", "-s", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


@pytest.mark.parametrize("runtime", ["working_set", "resident"])
def test_a_two_gpu_job_trains_the_one_gpu_job(tmp_path: Path, runtime: str) -> None:
    one, two = tiny_job_dir(tmp_path, 1, runtime), tiny_job_dir(tmp_path, 2, runtime)
    procs = [start(one), start(two)]
    (code1, msgs1), (code2, msgs2) = (finish(p) for p in procs)
    assert code1 == code2 == WorkerExit.succeeded, (two / "worker.log").read_text()[-3000:]
    losses = [[m.loss for m in msgs if m.kind == "step"] for msgs in (msgs1, msgs2)]
    assert losses[0][-1] == pytest.approx(losses[1][-1], rel=1e-5)
    assert sum(m.kind == "started" for m in msgs2) == 1  # rank 0 alone reports
    assert_close(last_weights(two), last_weights(one))
    assert "rank 0 of 2: started ranks" in (two / "worker.log").read_text()


def test_a_dead_rank_stops_the_gang(tmp_path: Path) -> None:
    job_dir = tiny_job_dir(tmp_path, 2, "working_set", steps=100_000)
    proc = start(job_dir)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # "started": both ranks are training
    assert WorkerMessage.model_validate_json(first).kind == "started"
    deadline = time.monotonic() + 30
    while len(pids := _gang_pids(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    rank1 = next(p for p in pids if p != proc.pid)
    os.kill(rank1, signal.SIGKILL)
    code, msgs = finish(proc)
    assert code == WorkerExit.failed
    errors = [m.message or "" for m in msgs if m.kind == "error"]
    assert errors and "rank 1" in errors[-1] and "exit code -9" in errors[-1], errors
    assert _gang_pids(proc.pid) == []


def test_sigterm_stops_every_rank_at_one_step_and_the_job_resumes(tmp_path: Path) -> None:
    want = tiny_job_dir(tmp_path / "whole", 1, "working_set", steps=STEPS)
    job_dir = tiny_job_dir(tmp_path, 2, "working_set", steps=STEPS)
    whole = start(want)
    proc = start(job_dir)
    assert proc.stdout is not None
    while True:  # a step is done: stop in the middle of the job
        msg = WorkerMessage.model_validate_json(proc.stdout.readline())
        if msg.kind == "step":
            break
    proc.send_signal(signal.SIGTERM)
    code, msgs = finish(proc)
    assert code == WorkerExit.cancelled, (job_dir / "worker.log").read_text()[-3000:]
    saved = [m.step for m in msgs if m.kind == "checkpoint"]
    assert saved and saved[-1] is not None and saved[-1] < STEPS
    assert _gang_pids(proc.pid) == []
    code, msgs = finish(start(job_dir))  # resumes from the checkpoint on two ranks
    assert code == WorkerExit.succeeded, (job_dir / "worker.log").read_text()[-3000:]
    assert finish(whole)[0] == WorkerExit.succeeded
    assert_close(last_weights(job_dir), last_weights(want))


def _session_memory_bytes(leader: int) -> int:
    """Memory a session's processes allocated: each one's private anonymous pages, plus each
    shared tile (a /dev/shm/wstrain-* mapping, fully allocated at creation) once. File-backed
    pages (torch's libraries) are left out: page cache, not the job's."""
    total, shared = 0, {}
    for pid in _gang_pids(leader):
        try:
            lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
        except OSError:  # exited meanwhile
            continue
        path = ""
        for line in lines:
            head = line.split()
            if not head[0].endswith(":"):  # a mapping's header: address perms offset dev inode path
                path = head[5] if len(head) > 5 else ""
            elif head[0] == "Size:" and path.startswith("/dev/shm/wstrain-"):
                shared[path] = int(head[1]) * 1024
            elif head[0] in ("Private_Clean:", "Private_Dirty:") and (
                not path or path.startswith("[") or path == "/dev/zero"
            ):  # anonymous: heap, stack, no path; mmap(-1) tiles show as /dev/zero
                total += int(head[1]) * 1024
    return total + sum(shared.values())


def test_two_ranks_hold_one_copy_of_the_host_state(tmp_path: Path) -> None:
    """A model whose training state (102M parameters, fp32: 1.63 GB of weights, gradients
    and moments) outweighs a process: the two-rank job's peak memory within 1.15x of one.

    Measured on CPU with exec'd workers: one rank peaks at 2.69 GiB (after one step as after
    two), the state's 1.52 GiB and 1.17 GiB of the process besides; the second rank adds
    0.14-0.17 GiB of its own: 1.05-1.06x, where 1.15x allows 0.40 GiB. Forked (rank 0 from
    the test zygote, rank 1 from rank 0), the pages they share copy-on-write with their
    parent count in neither: 2.49 GiB for one rank, 2.47 GiB for two. A second copy of the
    state is allocated after the fork, private to its rank, and would add its 1.52 GiB:
    1.56x or more. At 12 layers (202M parameters, 1.04x against 1.7x) the job takes twice
    the time; at 4 layers (1.02 GiB of state) 1.15x would allow about 0.3 GiB, too little
    headroom over the second rank's own 0.17 GiB."""
    peaks = []
    for gpus in (1, 2):
        spec = tiny_spec(
            f"pss{gpus}",
            steps=1,
            gpus=gpus,
            global_batch=2,
            model={
                "hf_config": {
                    "vocab_size": 512,
                    "hidden_size": 1024,
                    "intermediate_size": 4096,
                    "num_hidden_layers": 6,
                    "num_attention_heads": 8,
                    "num_key_value_heads": 8,
                }
            },
            budget={"device_gib": 2, "host_gib": 16},
            overrides={"runtime": "working_set", "micro_batch": 1},
        )
        job = JobSpec.model_validate(spec)
        plan = make_plan(job, resolve_dims(job.model), DEFAULT_PROFILE)
        job_dir = write_job(tmp_path / f"pss{gpus}", job, plan)
        proc, peak = start(job_dir), 0
        while proc.poll() is None:
            peak = max(peak, _session_memory_bytes(proc.pid))
            time.sleep(0.5)
        assert proc.returncode == WorkerExit.succeeded, (job_dir / "worker.log").read_text()[-3000:]
        peaks.append(peak)
    print(f"peak memory, 1 rank {peaks[0] / 2**30:.2f} GiB, 2 ranks {peaks[1] / 2**30:.2f} GiB")
    assert peaks[0] > 1.62e9, peaks  # the state was there to share
    assert peaks[1] <= 1.15 * peaks[0], [p / 2**30 for p in peaks]
