"""Worker processes by (pid, start time): a recorded process is found while it runs, counts
as gone once it exits (zombie included), is stopped with SIGTERM then SIGKILL, and a pid
whose start time differs is never signalled.

    pytest tests/agent/test_processes.py
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

from wstrain.agent.processes import is_running, start_ticks, stop_process


def _child(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(0.3)  # past interpreter start: signal handlers are in place
    return proc


def test_a_process_is_known_by_pid_and_start_time() -> None:
    proc = _child("import time; time.sleep(60)")
    try:
        start = start_ticks(proc.pid)
        assert start is not None and is_running(proc.pid, start)
        assert not is_running(proc.pid, start + 1)  # a recycled pid: another start time
        proc.kill()
        for _ in range(100):  # until the kernel has made it a zombie
            if start_ticks(proc.pid) is None:
                break
            time.sleep(0.01)
        assert proc.poll() is not None  # it is a zombie only until waited for
        assert not is_running(proc.pid, start)
    finally:
        proc.kill()
        proc.wait()


def test_stop_process_terminates_then_kills() -> None:
    polite = _child("import time; time.sleep(60)")
    stubborn = _child(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    )
    try:
        p_start, s_start = start_ticks(polite.pid), start_ticks(stubborn.pid)
        assert p_start is not None and s_start is not None

        async def both() -> tuple[str, str]:
            return await asyncio.gather(
                stop_process(polite.pid, p_start, grace_s=5),
                stop_process(stubborn.pid, s_start, grace_s=0.5),
            )

        # our children stay zombies until waited for, and zombies count as gone
        assert list(asyncio.run(both())) == ["exited", "killed"]
        assert polite.wait(5) == -signal.SIGTERM and stubborn.wait(5) == -signal.SIGKILL
    finally:
        for p in (polite, stubborn):
            p.kill()
            p.wait()


def test_a_recycled_pid_is_never_signalled() -> None:
    proc = _child("import time; time.sleep(60)")
    try:
        start = start_ticks(proc.pid)
        assert start is not None
        assert asyncio.run(stop_process(proc.pid, start - 1, grace_s=1)) == "gone"
        assert proc.poll() is None  # untouched
    finally:
        proc.kill()
        proc.wait()
