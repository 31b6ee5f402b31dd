"""Workers forked from the zygote (agent/zygote.py, worker/zygote.py), real processes: one
trains the tiny job to the weights an exec'd worker reaches, its reports read from its pipe;
a signal and its exit code arrive as asyncio reports them for an exec'd worker; a zygote
that dies leaves its workers running, waited for by pid, and the next spawn falls back."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_spec, zygote_server
from tests.worker.launch import assert_close, last_weights, tiny_job_dir, worker_argv, write_job
from wstrain.agent.processes import session_pids
from wstrain.agent.zygote import ZYGOTE_LOST_CODE, ForkedWorker, WorkerZygote
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import WorkerExit, WorkerMessage
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan


async def _fork(
    zygote: WorkerZygote, job_dir: Path, env: dict[str, str] | None = None
) -> ForkedWorker:
    with open(job_dir / "worker.log", "ab") as log:
        worker = await zygote.spawn(
            worker_argv(job_dir)[3:], {**os.environ, **(env or {})}, os.getcwd(), log.fileno()
        )
    assert worker is not None
    return worker


async def _reports(worker: ForkedWorker) -> list[WorkerMessage]:
    assert worker.stdout is not None
    return [WorkerMessage.model_validate_json(line) async for line in worker.stdout]


def test_a_forked_worker_trains_as_an_exec_d_one(tmp_path: Path) -> None:
    forked_dir = tiny_job_dir(tmp_path / "forked", 1, "working_set")
    exec_dir = tiny_job_dir(tmp_path / "exec", 1, "working_set")

    async def go() -> tuple[int, list[WorkerMessage], int]:
        zygote = await WorkerZygote.start(dict(os.environ))
        try:
            worker = await _fork(zygote, forked_dir)
            assert worker.pid in session_pids(worker.pid)  # it leads its own session
            messages = await _reports(worker)
            return await worker.wait(), messages, worker.pid
        finally:
            await zygote.close()

    code, messages, _ = asyncio.run(go())
    assert code == WorkerExit.succeeded, (forked_dir / "worker.log").read_text()[-2000:]
    assert messages[0].kind == "started"
    assert [m.step for m in messages if m.kind == "checkpoint"] == [2, 4, 6]
    exec_run = subprocess.run(worker_argv(exec_dir), capture_output=True, timeout=240)
    assert exec_run.returncode == WorkerExit.succeeded
    assert_close(last_weights(forked_dir), last_weights(exec_dir))


def test_a_signal_ends_a_forked_worker_with_asyncio_s_code(tmp_path: Path) -> None:
    job_dir = tiny_job_dir(tmp_path, 1, "working_set", steps=10_000)

    async def go() -> int:
        zygote = await WorkerZygote.start(dict(os.environ))
        try:
            worker = await _fork(zygote, job_dir)
            worker.send_signal(signal.SIGKILL)
            code = await asyncio.wait_for(worker.wait(), 60)
            worker.send_signal(signal.SIGTERM)  # an ended worker is never signalled again
            return code
        finally:
            await zygote.close()

    assert asyncio.run(go()) == -signal.SIGKILL


def test_a_dead_zygote_leaves_its_worker_running_and_spawns_fall_back(tmp_path: Path) -> None:
    job_dir = tiny_job_dir(tmp_path, 1, "working_set", steps=10_000)

    async def go() -> tuple[int, bool, ForkedWorker | None]:
        zygote = await WorkerZygote.start(dict(os.environ))
        worker = await _fork(zygote, job_dir)
        assert worker.stdout is not None
        first = WorkerMessage.model_validate_json(await worker.stdout.readline())
        assert first.kind == "started" and zygote.proc is not None
        zygote.proc.kill()
        await zygote.proc.wait()
        await asyncio.sleep(0.5)
        alive = worker.returncode is None and os.path.exists(f"/proc/{worker.pid}")
        again = await zygote.spawn(["--help"], dict(os.environ), os.getcwd(), 2)
        os.kill(worker.pid, signal.SIGKILL)
        code = await asyncio.wait_for(worker.wait(), 60)
        await zygote.close()
        return code, alive, again

    code, alive, again = asyncio.run(go())
    assert alive, "the worker died with its zygote"
    assert code == ZYGOTE_LOST_CODE and again is None


def test_a_zygote_server_forks_each_agent_its_own_zygote(tmp_path: Path) -> None:
    """Two agents' zygotes forked by one server (--listen, WSTRAIN_WORKER_ZYGOTE_SOCKET):
    each its own process, not the server; each forks a worker that trains the tiny job to
    the same weights; one agent closing its zygote leaves the other's forking."""
    dirs = [tiny_job_dir(tmp_path / str(i), 1, "working_set") for i in range(2)]

    async def go() -> tuple[list[int], list[int]]:
        first, second = [await WorkerZygote.start(dict(os.environ), zygote_server()) for _ in "ab"]
        try:
            one = await _fork(first, dirs[0])
            parents = [_parent(one.pid)]  # its zygote, while it trains
            codes = [await one.wait()]
            await first.close()
            assert not first.alive and second.alive
            two = await _fork(second, dirs[1])
            parents.append(_parent(two.pid))
            codes.append(await two.wait())
            return codes, parents
        finally:
            await second.close()

    codes, parents = asyncio.run(go())
    assert codes == [WorkerExit.succeeded] * 2, (dirs[0] / "worker.log").read_text()[-2000:]
    # each agent's workers come from a zygote of its own, neither this process
    assert len(set(parents)) == 2 and os.getpid() not in parents and -1 not in parents, parents
    assert_close(last_weights(dirs[0]), last_weights(dirs[1]))


def _parent(pid: int) -> int:
    """A process's parent, from /proc (-1 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("runtime", ["resident", "working_set"])
def test_a_forked_worker_trains_on_the_gpu_its_request_names(tmp_path: Path, runtime: str) -> None:
    """The zygote never initialised CUDA: its child does, on the GPU of its request's
    CUDA_VISIBLE_DEVICES, with the agent's allocator settings (a lent H100/H200)."""
    spec = JobSpec.model_validate(
        tiny_spec(
            f"zygote-{runtime}",
            steps=4,
            checkpoint_every=2,
            precision="bf16",
            overrides={"runtime": runtime, "device": "cuda"},
            budget={"device_gib": 8, "host_gib": 16},
        )
    )
    job_dir = write_job(tmp_path, spec, make_plan(spec, resolve_dims(spec.model), DEFAULT_PROFILE))
    last = str(torch.cuda.device_count() - 1)
    env = {"CUDA_VISIBLE_DEVICES": last, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

    async def go() -> tuple[int, list[WorkerMessage]]:
        zygote = await WorkerZygote.start(dict(os.environ))
        try:
            worker = await _fork(zygote, job_dir, env)
            messages = await _reports(worker)
            return await worker.wait(), messages
        finally:
            await zygote.close()

    code, messages = asyncio.run(go())
    assert code == WorkerExit.succeeded, (job_dir / "worker.log").read_text()[-3000:]
    started = next(m for m in messages if m.kind == "started")
    assert started.peak_source and started.peak_source != "configured"  # a GPU's peak
    assert [m.step for m in messages if m.kind == "checkpoint"] == [2, 4]
