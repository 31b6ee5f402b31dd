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

from tests.worker.launch import assert_close, last_weights, tiny_job_dir, worker_argv
from wstrain.agent.processes import session_pids
from wstrain.agent.zygote import ZYGOTE_LOST_CODE, ForkedWorker, WorkerZygote
from wstrain.contracts.jobs import WorkerExit, WorkerMessage


async def _fork(zygote: WorkerZygote, job_dir: Path) -> ForkedWorker:
    with open(job_dir / "worker.log", "ab") as log:
        worker = await zygote.spawn(
            worker_argv(job_dir)[3:], dict(os.environ), os.getcwd(), log.fileno()
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
        assert first.kind == "started"
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
