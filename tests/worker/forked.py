"""Worker processes for the worker tests, forked from a worker zygote (src/wstrain/worker/
zygote.py, the process an agent forks its workers from) instead of each a fresh `python -m
wstrain.worker.main`: a fresh interpreter's torch import is 3.3 CPU-s on the 2-core CI
machine and these tests start about 20 workers. The zygote is the one this test process's
zygote server (tests/conftest.py zygote_server, which its agents share) forks for it.

A forked worker is the worker the agent runs: `wstrain.worker.main.main(ARGV)` in its own
session, its stdout a pipe, its stderr a file, the environment and directory it is given.
The exec'd start stays tested where it is the subject: tests/agent/test_zygote.py (a forked
worker trains to an exec'd one's weights) and the multi-node e2e (WSTRAIN_WORKER_ZYGOTE=false).

    proc = spawn(worker_argv(job_dir), stderr=log_file)   # Popen's pid, stdout, poll...
    out, _ = proc.communicate(timeout=120)
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any

from tests.conftest import zygote_server

POLL_S = 0.05  # how often wait() asks the zygote whether the worker ended


class _Zygote:
    """A zygote the server forked for this process, and its socket: pids out, exit codes
    back (the protocol of src/wstrain/worker/zygote.py)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(zygote_server())
        self.gone = False  # its socket closed: the zygote (or its server) died
        self.exited: dict[int, int] = {}  # pid -> exit code (minus the signal), as reported
        self.lock = threading.Lock()  # one request or read at a time on the socket

    def _take(self, data: bytes) -> int | None:
        """Record an {"exited"} report; the pid of a {"pid"} one."""
        if not data:
            self.gone = True
            raise AssertionError("the test zygote died; its stderr went to the test's")
        msg = json.loads(data)
        if "exited" in msg:
            self.exited[int(msg["exited"])] = int(msg["code"])
            return None
        return int(msg["pid"])

    def spawn(
        self, argv: list[str], env: dict[str, str], cwd: str, stderr_fd: int
    ) -> tuple[int, int]:
        """Fork a worker; (its pid, the read end of its stdout)."""
        read_fd, write_fd = os.pipe()
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        with self.lock:
            try:
                socket.send_fds(self.sock, [request], [write_fd, stderr_fd])
            finally:
                os.close(write_fd)
            while (pid := self._take(self.sock.recv(4096))) is None:
                pass
        return pid, read_fd

    def code(self, pid: int) -> int | None:
        """`pid`'s exit code once the zygote reported it ended."""
        with self.lock:
            while pid not in self.exited:
                try:
                    data = self.sock.recv(4096, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                self._take(data)
            return self.exited.get(pid)

    def close(self) -> None:
        self.sock.close()  # the zygote exits on EOF; forked workers live on


_ZYGOTES: list[_Zygote] = []


def _zygote() -> _Zygote:
    if not _ZYGOTES or _ZYGOTES[0].gone:
        _ZYGOTES[:] = [_Zygote()]
        atexit.register(_ZYGOTES[0].close)
    return _ZYGOTES[0]


class ForkedWorker:
    """What the tests use of a `subprocess.Popen` of the worker: pid, stdout, returncode,
    poll, wait, communicate, send_signal."""

    def __init__(self, zygote: _Zygote, pid: int, stdout_fd: int, text: bool) -> None:
        self._zygote, self.pid, self.text = zygote, pid, text
        self.stdout: IO[Any] = os.fdopen(stdout_fd, "r" if text else "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
            time.sleep(POLL_S)
        return code

    def communicate(self, timeout: float | None = None) -> tuple[Any, None]:
        """Read stdout to its end, then wait for the exit: (stdout, None) as Popen's
        communicate with stdout alone piped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd, chunks = self.stdout.fileno(), []
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
            if not (chunk := os.read(fd, 1 << 16)):
                break
            chunks.append(chunk)
        self.stdout.close()
        out = b"".join(chunks)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        return (out.decode() if self.text else out), None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(
    argv: list[str],
    stderr: IO[Any] | None = None,
    env: dict[str, str] | None = None,
    text: bool = True,
) -> ForkedWorker:
    """The worker command `argv` (`python -m wstrain.worker.main ...`, tests/worker/launch.py
    worker_argv) forked from this test process's zygote, in this process's directory, with
    `env` (else this process's environment), stderr to `stderr` (else /dev/null)."""
    assert argv[:3] == [sys.executable, "-m", "wstrain.worker.main"], argv[:3]
    zygote = _zygote()
    with open(os.devnull, "w") as null:
        err = stderr if stderr is not None else null
        pid, out = zygote.spawn(argv[3:], dict(env or os.environ), os.getcwd(), err.fileno())
    return ForkedWorker(zygote, pid, out, text)


def run(
    argv: list[str], stderr_path: str | os.PathLike[str], timeout: float
) -> tuple[int, str, str]:
    """A forked worker run to its end: (exit code, stdout, stderr), its stderr kept at
    `stderr_path` too."""
    with open(stderr_path, "w") as err:
        proc = spawn(argv, stderr=err)
    out, _ = proc.communicate(timeout=timeout)
    with open(stderr_path) as err:
        return proc.wait(), out, err.read()
