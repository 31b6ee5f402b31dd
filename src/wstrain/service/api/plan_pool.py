"""Planner processes that can be stopped: each runs validate_and_plan (service/validation.py)
for one request at a time, and one past its deadline is killed (SIGKILL) and replaced, so
the CPU it was burning is free at once. A thread could not be stopped: eight 51 s plans
(tiny-llama at seq_len 1048576) once held the API's four planning threads for 8 minutes.

    slot = await PlannerProcess.start(access)         # forked, ready to plan
    outcome = await slot.run(spec, nodes, timeout_s)   # Planned, Refused, Overran, ...
    slot.kill()                                        # after Overran: SIGKILL, then reap

Processes come from multiprocessing's 'forkserver', which imports validation.py once (numpy,
pydantic, the planner; never torch, never the API's event loop): a replacement forks from it
ready to plan, in 10-30 ms instead of the ~1 s a fresh interpreter takes to import them.
The API's event loop only ever waits on a pipe's readability (loop.add_reader): it never
blocks on a planner.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess

from wstrain.scheduler.contracts.access import DataAccess
from wstrain.scheduler.contracts.errors import WstrainError
from wstrain.scheduler.contracts.jobs import Node
from wstrain.scheduler.contracts.plan import Plan
from wstrain.scheduler.contracts.spec import JobSpec

_READY = b"ready"
# what the forkserver imports once, so each planner forks with them loaded
_PRELOAD = ["wstrain.service.api.plan_pool", "wstrain.service.validation"]


def _context() -> ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    # effective only before the forkserver first starts (the API's lifespan starts it)
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _serve(conn: Connection, access: DataAccess) -> None:
    """A planner process: answer each (spec, nodes) with ("ok", plan), ("refused", error)
    or ("bug", text) until the API closes the pipe."""
    # Ctrl-C on `wstrain serve` reaches the whole process group: the API stops its planners
    # itself, so a KeyboardInterrupt traceback here would only be noise
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from wstrain.service.validation import validate_and_plan

    conn.send_bytes(_READY)
    while True:
        try:
            spec, nodes = conn.recv()
        except EOFError:  # the API closed its end or exited
            return
        try:
            conn.send(("ok", validate_and_plan(spec, nodes, access)))
        except WstrainError as exc:  # InvalidSpec / InfeasibleBudget: pickled with detail
            conn.send(("refused", exc))
        except Exception as exc:  # a bug: the API answers 500 and logs it
            conn.send(("bug", f"{type(exc).__name__}: {exc}"))


@dataclass(frozen=True)
class Planned:
    plan: Plan


@dataclass(frozen=True)
class Refused:
    error: WstrainError


@dataclass(frozen=True)
class Overran:
    """Still planning at the deadline: the caller kills the process."""


@dataclass(frozen=True)
class Died:
    """The process exited mid-request: killed from outside, or by the OOM killer."""

    reason: str


@dataclass(frozen=True)
class Bug:
    """validate_and_plan raised something other than a WstrainError."""

    reason: str


Outcome = Planned | Refused | Overran | Died | Bug


async def _readable(conn: Connection, timeout_s: float) -> bool:
    """Whether `conn` has data (or EOF) within `timeout_s`, waiting on the event loop."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await asyncio.wait_for(ready, timeout_s)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


class PlannerProcess:
    """One planner process and the API's end of its pipe."""

    # a fork from the forkserver is ready in 10-30 ms; 60 s covers the forkserver's own
    # first start (importing numpy, pydantic and the planner) on a loaded 2-core host
    START_TIMEOUT_S = 60.0

    def __init__(self, proc: BaseProcess, conn: Connection) -> None:
        self.proc = proc
        self.conn = conn

    @classmethod
    async def start(cls, access: DataAccess) -> PlannerProcess:
        """A new planner process, once it has said it is ready."""
        ctx = _context()
        ours, theirs = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_serve, args=(theirs, access), daemon=True, name="wstrain-plan")
        # start() talks to the forkserver (starting it the first time): off the event loop
        await asyncio.get_running_loop().run_in_executor(None, proc.start)
        theirs.close()
        slot = cls(proc, ours)
        if not await _readable(ours, cls.START_TIMEOUT_S) or ours.recv_bytes() != _READY:
            slot.kill()
            raise RuntimeError(f"a planner process did not start in {cls.START_TIMEOUT_S} s")
        return slot

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.is_alive()

    async def run(self, spec: JobSpec, nodes: list[Node], timeout_s: float) -> Outcome:
        """validate_and_plan(spec, nodes) in this process, waited for at most `timeout_s`."""
        try:
            # a spec is at most WSTRAIN_MAX_BODY_BYTES (1 MiB) and this process is idle,
            # reading: the write does not wait on it
            self.conn.send((spec, nodes))
            if not await _readable(self.conn, timeout_s):
                return Overran()
            kind, value = self.conn.recv()
        except (OSError, EOFError) as exc:  # the process is gone: BrokenPipe, EOF
            return Died(f"its process exited ({self.proc.exitcode=}; {type(exc).__name__})")
        if kind == "ok":
            return Planned(value)
        if kind == "refused":
            return Refused(value)
        return Bug(str(value))

    def kill(self) -> None:
        """SIGKILL now (its CPU is free at once); close the pipe. Reap with `reap`."""
        if self.proc.is_alive():
            self.proc.kill()
        self.conn.close()

    async def reap(self) -> None:
        """Wait, off the event loop, for a killed process's exit to be collected."""
        await asyncio.get_running_loop().run_in_executor(None, self.proc.join, 5.0)
