"""A data-parallel worker's process tree as the agent sees it (agent/processes.py):
its session's host memory with shared pages counted once, and the ranks it leaves behind
killed with its process group.

    pytest tests/agent/test_gang_processes.py
"""

from __future__ import annotations

import subprocess
import sys
import time

from wstrain.agent.processes import (
    kill_group,
    pss_bytes,
    session_pids,
    session_pss_bytes,
    start_ticks,
)

SHARED_MIB = 256
# A worker stand-in: it leads its own session (as the agent spawns it), fills 256 MiB, then
# forks a "rank" that shares those pages copy-on-write; both sleep.
_WORKER = f"""
import os, time
state = bytearray({SHARED_MIB} << 20)
for i in range(0, len(state), 4096):
    state[i] = 1
if os.fork() == 0:
    time.sleep(120)
    os._exit(0)
print("ready", flush=True)
time.sleep(120)
"""


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def _worker() -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _wait_gone(pid: int) -> bool:
    for _ in range(200):
        if start_ticks(pid) is None:
            return True
        time.sleep(0.01)
    return False


def test_a_sessions_pss_counts_pages_its_ranks_share_once() -> None:
    proc = _worker()
    try:
        members = session_pids(proc.pid)
        assert len(members) == 2 and proc.pid in members
        rss = sum(_rss_bytes(p) for p in members)
        pss = session_pss_bytes(proc.pid)
        assert pss is not None
        shared = SHARED_MIB << 20
        assert rss > 2 * shared  # each process's RSS counts the shared pages in full
        assert shared <= pss < rss - shared // 2  # PSS counts them once
        # The sum of its members' PSS, read a moment later: the two processes still fault
        # in or copy a few interpreter pages between reads (8 KiB seen in CI), hence 1 MiB.
        again = sum(b for b in map(pss_bytes, members) if b is not None)
        assert abs(pss - again) < 1 << 20
    finally:
        kill_group(proc.pid)
        proc.wait()


def test_killing_a_workers_group_takes_the_ranks_it_left() -> None:
    proc = _worker()
    (rank,) = [p for p in session_pids(proc.pid) if p != proc.pid]
    proc.kill()  # the worker dies; its rank lives on
    proc.wait()
    assert start_ticks(rank) is not None
    kill_group(proc.pid)
    assert _wait_gone(rank)
    assert session_pss_bytes(proc.pid) is None
    kill_group(proc.pid)  # an empty group: nothing to do, no error
