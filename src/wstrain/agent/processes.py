"""Worker processes by identity, not by pid alone: what a restarted agent uses to find, and
stop, the workers its predecessor left running.

A pid is recycled; (pid, start time) is not. The start time is field 22 of /proc/PID/stat,
in clock ticks since boot, so it names one process for the life of the machine. Linux only:
where /proc is missing, `start_ticks` is None and a recorded worker counts as gone.

    from wstrain.agent.processes import start_ticks, stop_process
    start = start_ticks(pid)                  # record it with the pid
    await stop_process(pid, start, grace_s)   # SIGTERM, then SIGKILL after grace_s
    session_pss_bytes(pid)                    # a worker and its ranks' host memory
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often a stopping process is looked at


def start_ticks(pid: int) -> int | None:
    """The start time of live process `pid` (clock ticks since boot); None when no such
    process runs (a zombie counts as gone: it trains nothing and holds no files)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may itself hold spaces or ')'
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):  # zombie or dead: exited, not yet reaped by its parent
        return None
    return int(fields[19])


def session_pids(sid: int) -> list[int]:
    """The live processes of session `sid`: a worker is spawned leading its own session
    (sid = its pid), and the ranks it starts, its children, stay in it."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rindex(b")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
            out.append(int(name))
    return out


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of `pid` (pages shared with other processes split between
    them), from /proc/PID/smaps_rollup; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def session_pss_bytes(sid: int) -> int | None:
    """Host memory of a session's processes, shared pages counted once (the sum of their
    PSS): a data-parallel worker and its ranks share one host copy of the training state,
    which each one's RSS would count in full. None where no member can be read."""
    sizes = [b for b in map(pss_bytes, session_pids(sid)) if b is not None]
    return sum(sizes) if sizes else None


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in process group `pgid` (a worker's, once it is gone or
    past its grace: ranks it started must not keep their GPUs). The kernel does not reuse
    a pid while it names a live group (and hands pids out cyclically), so this does not
    hit a stranger."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is empty
        os.killpg(pgid, signal.SIGKILL)


def is_running(pid: int | None, start: int | None) -> bool:
    """Whether the process recorded as (pid, start) still runs."""
    return pid is not None and start is not None and start_ticks(pid) == start


def _signal(pid: int, start: int, sig: signal.Signals) -> None:
    """Send `sig` to (pid, start) only: through a pidfd, opened and then checked against the
    start time, so a pid recycled between the check and the signal is never hit."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd (kernel < 5.3): a plain kill right after the check
        if is_running(pid, start):
            os.kill(pid, sig)
        return
    try:
        if start_ticks(pid) == start:
            signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


async def stop_process(pid: int, start: int, grace_s: float) -> str:
    """Stop the process recorded as (pid, start): SIGTERM (a worker then checkpoints at its
    next step boundary and exits), SIGKILL once `grace_s` has passed. Returns how it ended:
    "gone" (it was not running), "exited" or "killed". Never signals a recycled pid."""
    if not is_running(pid, start):
        return "gone"
    _signal(pid, start, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not is_running(pid, start):
            return "exited"
        await asyncio.sleep(POLL_S)
    if is_running(pid, start):
        log.warning("pid %d did not stop in %.0f s after SIGTERM; killing it", pid, grace_s)
        _signal(pid, start, signal.SIGKILL)
        while is_running(pid, start):
            await asyncio.sleep(POLL_S)
    return "killed"
