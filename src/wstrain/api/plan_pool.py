"""Planner processes that can be stopped: each runs validate_and_plan (api/validation.py)
for one request at a time, and one past its deadline is killed (SIGKILL) and replaced, so
the CPU it was burning is free at once. A thread could not be stopped: eight 51 s plans
(tiny-llama at seq_len 1048576) once held the API's four planning threads for 8 minutes.

    zygote = await Zygote.start(access, 4 << 30)       # python -m ...plan_pool: ~0.5 s
    slot = await zygote.fork()                         # a planner, ready in ~10 ms
    outcome = await slot.run(spec, nodes, timeout_s)   # Planned, Refused, Overran, ...
    slot.kill()                                        # after Overran: SIGKILL

The zygote is `python -m wstrain.api.plan_pool FD`: a fresh interpreter, single
threaded, that imports validation.py once (numpy, pydantic, the planner; never torch, never
FastAPI) and forks a planner for each socket the API sends it (SCM_RIGHTS over FD). A
replacement so costs a fork, not the ~1 s of CPU a new interpreter spends importing: under
a flood of specs that each run out their deadline, imports would otherwise take a core.
Not multiprocessing's forkserver or spawn: both import the API's `__main__` again in every
child (all of FastAPI under `wstrain serve`); and a fork of the API itself would copy its
event loop's threads and locks. The API only ever waits on its sockets' readability
(loop.add_reader, loop.sock_recv): its event loop never blocks on a planner.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import pickle
import resource
import select
import signal
import socket
import subprocess
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from wstrain.contracts.access import DataAccess
from wstrain.contracts.errors import InvalidSpec, WstrainError
from wstrain.contracts.jobs import Node
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec

_READY = b"ready"
_PID_BYTES = 8
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# one thread each for numpy's BLAS: the planner does no large linear algebra, and a zygote
# with no threads forks cleanly
_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _plan_forever(conn: Connection, access: DataAccess, memory_bytes: int) -> None:
    """A planner: answer each (spec, nodes) with ("ok", plan), ("refused", error) or
    ("bug", text) until the API closes its end; ("spent", error) and exit when a plan
    needed more than `memory_bytes`."""
    from wstrain.api.validation import validate_and_plan

    # RLIMIT_DATA counts the heap and private mappings, not the read-only maps of token
    # files (np.memmap), so a 100 GiB corpus is checked under a 4 GiB cap all the same
    resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
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
        except MemoryError:
            conn.send(("spent", over_memory(memory_bytes)))
            return  # its heap may be fragmented past use: the API forks a fresh one
        except Exception as exc:  # a bug: the API answers 500 and logs it
            conn.send(("bug", f"{type(exc).__name__}: {exc}"))


def over_memory(memory_bytes: int) -> InvalidSpec:
    """The refusal of a spec whose planning took more than the planners' memory cap, or
    killed two planners in a row (the OOM killer, or native code that aborts when an
    allocation fails)."""
    return InvalidSpec(
        f"planning this spec needed more than WSTRAIN_PLAN_MEMORY_BYTES={memory_bytes} "
        f"({memory_bytes / 2**30:g} GiB) of memory; use a shorter seq_len, fewer layers or "
        "a smaller global_batch, set overrides.runtime to plan one runtime, or raise "
        "WSTRAIN_PLAN_MEMORY_BYTES on the API",
        memory_bytes=memory_bytes,
    )


def _die_with_parent() -> None:
    """SIGKILL this planner when the zygote exits, which it does when the API does: no
    plan runs on for minutes after an API was killed."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: planners exit at their next request
        return
    if os.getppid() == 1:  # the zygote died before prctl took effect
        os._exit(1)


def _zygote(control: socket.socket) -> None:
    """Read the DataAccess, then fork a planner for each socket received on `control`
    and answer its pid, until the API closes `control`."""
    # Ctrl-C on `wstrain serve` reaches the whole process group: the API stops the zygote
    # and planners itself, so a KeyboardInterrupt traceback would only be noise
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps exited planners
    import wstrain.api.validation  # noqa: F401  # once, here, for every planner

    access, memory_bytes = pickle.loads(control.recv(1 << 20))
    control.sendall(_READY)
    while True:
        _, fds, _, _ = socket.recv_fds(control, 16, 1)
        if not fds:  # the API closed its end or exited
            return
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _die_with_parent()
                _plan_forever(Connection(fds[0]), access, memory_bytes)
            except BaseException:  # to the API's stderr, and the API sees the planner die
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)  # never back into the zygote's loop
        os.close(fds[0])
        control.sendall(pid.to_bytes(_PID_BYTES, "little"))


@dataclass(frozen=True)
class Planned:
    plan: Plan


@dataclass(frozen=True)
class Refused:
    error: WstrainError
    spent: bool = False  # the process exited after it (out of memory): replace it


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
    """One planner (a child of the zygote) and the API's end of its socket."""

    def __init__(self, pid: int, conn: Connection) -> None:
        self.pid = pid
        self.conn = conn

    def alive(self) -> bool:
        """An idle planner never writes: a readable socket is its EOF, its exit."""
        if self.conn.closed:
            return False
        readable, _, _ = select.select([self.conn.fileno()], [], [], 0)
        return not readable

    async def run(self, spec: JobSpec, nodes: list[Node], timeout_s: float) -> Outcome:
        """validate_and_plan(spec, nodes) in this process, waited for at most `timeout_s`."""
        try:
            # a spec is at most WSTRAIN_MAX_BODY_BYTES (1 MiB) and this process is idle,
            # reading: the write does not wait on it for long
            self.conn.send((spec, nodes))
            if not await _readable(self.conn, timeout_s):
                return Overran()
            kind, value = self.conn.recv()
        except (OSError, EOFError, pickle.UnpicklingError) as exc:  # the process is gone
            return Died(f"planner {self.pid} exited ({type(exc).__name__})")
        if kind == "ok":
            return Planned(value)
        if kind in ("refused", "spent"):
            return Refused(value, spent=kind == "spent")
        return Bug(str(value))

    def kill(self) -> None:
        """SIGKILL now, so its CPU is free at once; the zygote reaps it."""
        if self.alive():  # not after its exit: the pid may be another process's by then
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.conn.close()


class Zygote:
    """The process that forks planners, and the API's end of its control socket."""

    # imports take ~0.5 s on an idle core; 60 s covers a loaded 2-core host
    START_TIMEOUT_S = 60.0

    def __init__(self, proc: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.proc = proc
        self.control = control
        self._lock = asyncio.Lock()  # one fork request and its pid answer at a time

    @classmethod
    async def start(cls, access: DataAccess, memory_bytes: int) -> Zygote:
        """A zygote that has imported the planner and holds `access`; its planners may
        take `memory_bytes` of heap each."""
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        # fork+exec: a few ms, off the event loop all the same
        proc = await loop.run_in_executor(
            None,
            lambda: subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env={**os.environ, **_ONE_THREAD},
            ),
        )
        theirs.close()
        ours.setblocking(False)
        zygote = cls(proc, ours)
        try:
            await loop.sock_sendall(ours, pickle.dumps((access, memory_bytes)))  # < 1 KiB
            ready = await asyncio.wait_for(loop.sock_recv(ours, len(_READY)), cls.START_TIMEOUT_S)
            if ready != _READY:
                raise EOFError("it exited during start-up")
        except (OSError, EOFError, TimeoutError) as exc:
            zygote.close()
            raise RuntimeError(f"the planner zygote did not start: {exc!r}") from exc
        return zygote

    def alive(self) -> bool:
        return self.proc.poll() is None

    async def fork(self) -> PlannerProcess:
        """A new planner, once it has said it is ready; OSError/EOFError if the zygote is
        gone (start another)."""
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        try:
            async with self._lock:
                # 16 bytes and a descriptor into an idle socket's buffer: does not block
                socket.send_fds(self.control, [b"fork"], [theirs.fileno()])
                answer = await asyncio.wait_for(
                    loop.sock_recv(self.control, _PID_BYTES), self.START_TIMEOUT_S
                )
            if len(answer) != _PID_BYTES:
                raise EOFError("the planner zygote exited")
        finally:
            theirs.close()
        slot = PlannerProcess(int.from_bytes(answer, "little"), Connection(ours.detach()))
        if not await _readable(slot.conn, self.START_TIMEOUT_S) or (
            slot.conn.recv_bytes() != _READY
        ):
            slot.kill()
            raise EOFError(f"planner {slot.pid} did not start")
        return slot

    def close(self) -> None:
        """Stop the zygote (its planners are killed by their owner, the Planner)."""
        self.control.close()  # it reads EOF and exits
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)  # a SIGKILLed process is reaped in milliseconds


if __name__ == "__main__":  # python -m wstrain.api.plan_pool FD: the zygote
    _zygote(socket.socket(fileno=int(sys.argv[1])))
