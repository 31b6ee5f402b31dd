"""The agent's end of the worker zygote (worker/zygote.py): workers forked from a process
that imported torch once, at milliseconds a start instead of the 3.3-3.6 CPU-s of a fresh
interpreter (4.6-4.9 CPU-s with the optimizer's first torch._dynamo import).

A forked worker is the agent's `WorkerProcess` as an exec'd one is: its pid leads its own
session, its stdout is a pipe the agent reads, its stderr the job's log, and its exit code
comes from the zygote, its parent, over their socket. When the zygote is off
(`WSTRAIN_WORKER_ZYGOTE=false`), has not started, or has died, workers are exec'd as before;
a worker whose zygote died before reporting its end is waited for by its pid, its exit code
unknown (ZYGOTE_LOST_CODE: a crash, retried as one).

    zygote = await WorkerZygote.start(env)           # with the agent's first worker
    zygote = await WorkerZygote.start(env, PATH)     # or: forked for it by a zygote server
    proc = await zygote.spawn(argv, env, stdout_w, log_fd)
    code = await proc.wait()
    await zygote.close()                              # after the workers are stopped
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections import deque
from typing import Protocol

from wstrain.agent.processes import POLL_S, start_ticks

log = logging.getLogger(__name__)

ZYGOTE_LOST_CODE = 255  # a worker's exit code when its zygote died first: unknown, a crash
STREAM_LIMIT_BYTES = 1 << 16  # a worker's longest report line, as asyncio's subprocess reads


class WorkerProcess(Protocol):
    """What the agent uses of a worker process, exec'd or forked."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def stdout(self) -> asyncio.StreamReader | None: ...
    async def wait(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


class ForkedWorker:
    """A worker the zygote forked: its pid once the zygote replies, its end through `ended`."""

    def __init__(self, stdout: asyncio.StreamReader):
        self.stdout = stdout
        self.pid = -1  # until the zygote replies; stays -1 when it could not fork
        self.returncode: int | None = None
        self.forked = asyncio.Event()
        self._ended = asyncio.Event()

    def ended(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def orphaned(self) -> None:
        """The zygote died: this worker's end is seen by its pid from now."""
        self.forked.set()
        self._ended.set()

    async def wait(self) -> int:
        await self._ended.wait()
        if self.returncode is None:  # orphaned: its new parent reaps it, we only see it go
            while start_ticks(self.pid) is not None:
                await asyncio.sleep(POLL_S)
            self.returncode = ZYGOTE_LOST_CODE
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self.pid > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WorkerZygote:
    """The zygote process and the reader of its reports."""

    def __init__(self, proc: asyncio.subprocess.Process | None, sock: socket.socket):
        """`proc`: the zygote this agent started; None for one a server forked for it."""
        self.proc, self.sock = proc, sock
        self.workers: dict[int, ForkedWorker] = {}  # forked and not yet ended, by pid
        self._pending: deque[ForkedWorker] = deque()  # requests sent, in order, unanswered
        self._lock = asyncio.Lock()  # requests go out whole, one after the other
        self._closing = False
        self._reader = asyncio.create_task(self._read(), name="zygote-reader")

    @classmethod
    async def start(cls, env: dict[str, str], server: str = "") -> WorkerZygote:
        """`python -m wstrain.worker.zygote --fd N` with `env` (the agent's own); with
        `server`, a zygote forked for this agent by `python -m wstrain.worker.zygote --listen
        SERVER` instead (a fork, not a fresh interpreter's 3 CPU-s of imports)."""
        if server:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, server)
            except OSError:
                sock.close()
                raise
            log.info("worker zygote forked by the server at %s", server)
            return cls(None, sock)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "wstrain.worker.zygote",
                "--fd",
                str(theirs.fileno()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                env=env,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # a Ctrl-C to the agent must not end it first
            )
        finally:
            theirs.close()
        mine.setblocking(False)
        log.info("worker zygote pid %d started", proc.pid)
        return cls(proc, mine)

    @property
    def alive(self) -> bool:
        started = self.proc is None or self.proc.returncode is None
        return started and not self._reader.done()

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await loop.sock_recv(self.sock, 4096):
                msg = json.loads(data)
                if "pid" in msg:
                    worker = self._pending.popleft()
                    worker.pid = int(msg["pid"])
                    self.workers[worker.pid] = worker
                    worker.forked.set()
                elif (done := self.workers.pop(int(msg["exited"]), None)) is not None:
                    done.ended(int(msg["code"]))
        except (OSError, ValueError) as exc:
            log.error("worker zygote: its socket failed (%s)", exc)
        finally:
            if not self._closing:
                pid = self.proc.pid if self.proc else "(a server's)"
                log.warning("worker zygote %s is gone; workers are exec'd now", pid)
            for worker in [*self._pending, *self.workers.values()]:
                worker.orphaned()
            self._pending.clear()
            self.workers.clear()

    async def spawn(
        self, argv: list[str], env: dict[str, str], cwd: str, stderr_fd: int
    ) -> ForkedWorker | None:
        """Fork `python -m wstrain.worker.main ARGV` with `env` in `cwd`, its stdout a pipe
        read here, its stderr `stderr_fd`. None when the zygote is gone or could not fork
        (the caller execs the worker instead)."""
        if not self.alive:
            return None
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        read_fd, write_fd = os.pipe()
        worker = ForkedWorker(asyncio.StreamReader(limit=STREAM_LIMIT_BYTES))
        try:
            async with self._lock:
                socket.send_fds(self.sock, [request], [write_fd, stderr_fd])
                self._pending.append(worker)
        except OSError as exc:
            log.error("worker zygote: a request failed (%s)", exc)
            os.close(read_fd)
            return None
        finally:
            os.close(write_fd)  # the zygote holds its own copy now
        await worker.forked.wait()
        if worker.pid < 0:
            os.close(read_fd)
            return None
        protocol = asyncio.StreamReaderProtocol(worker.stdout)
        pipe = os.fdopen(read_fd, "rb", buffering=0)
        await asyncio.get_running_loop().connect_read_pipe(lambda: protocol, pipe)
        return worker

    async def close(self) -> None:
        """Stop the zygote (workers it forked carry on, in their own sessions)."""
        self._closing = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # the zygote reads its end of the input
        if self.proc is None:  # a server's: it exits on its own; its end of the socket closes
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reader), 5)
        else:
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        self.sock.close()
