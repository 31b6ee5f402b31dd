"""The worker zygote: one process per agent that has imported torch and the worker once, and
forks each worker from that state instead of starting a fresh interpreter.

A worker's interpreter start costs 3.3-3.6 CPU-s on the 2-core CI machine before it trains
(torch's import, 3.2 s of it) and 1.3 s more when its optimizer first imports torch._dynamo;
a fork of this process costs milliseconds. Nothing here touches CUDA, so a forked child
initialises its GPUs itself, with the CUDA_VISIBLE_DEVICES and allocator settings its
request carries (fork after CUDA is initialised would not be safe; `serve` asserts it is not).

Protocol, over the SOCK_SEQPACKET socket whose fd the agent passes as `--fd` (agent/zygote.py):
- agent -> zygote: one JSON request {"argv": [...], "env": {...}, "cwd": "..."} with two
  fds, the worker's stdout (a pipe the agent reads) and stderr (its log file);
- zygote -> agent: {"pid": N} for each request, in order, then {"exited": N, "code": C}
  once that child ends (C as asyncio reports it: negative for a signal).
The zygote exits when the agent closes its end; the workers live on in their own
sessions, as workers started by exec do when their agent stops.

A host that runs several agents (the test suite starts about 30) can pay torch's import
once for all of them: `--listen PATH` serves each agent that connects to PATH (its
WSTRAIN_WORKER_ZYGOTE_SOCKET) from a zygote forked for it, which speaks the protocol above
on that connection and exits when the agent closes it.

    python -m wstrain.worker.zygote --fd N         # started by the agent, never by hand
    python -m wstrain.worker.zygote --listen PATH  # a zygote for each agent that connects
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import sys
import traceback

import torch
import torch._dynamo  # the first optimizer's import, paid once here

from wstrain.worker import main as worker_main

MAX_REQUEST_BYTES = 1 << 20  # argv and env of one worker: a few KiB


def _run_child(request: dict[str, object], out_fd: int, err_fd: int, in_session: int) -> None:
    """In the forked child: become the worker `request` describes; never returns."""
    code = 1
    try:
        os.setsid()  # its own session: a Ctrl-C to the agent reaches no worker
        os.close(in_session)  # the zygote may tell the agent the pid now
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the agent socket, the wake pipe
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})
        os.chdir(str(request["cwd"]))
        argv = [str(a) for a in request["argv"]]  # type: ignore[attr-defined]
        sys.argv = [str(worker_main.__file__), *argv]
        code = worker_main.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _exit_code(status: int) -> int:
    """waitpid's status as asyncio's returncode: the exit code, or minus the signal."""
    return os.waitstatus_to_exitcode(status)


def _reap(agent: socket.socket) -> None:
    """Report every child that has ended since the last call."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        agent.send(json.dumps({"exited": pid, "code": _exit_code(status)}).encode())


def serve(agent: socket.socket) -> None:
    """Fork a worker for each request until the agent closes its end."""
    assert not torch.cuda.is_initialized(), "the zygote must not initialise CUDA"
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
    while True:
        readable, _, _ = select.select([agent.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(agent)
        if agent.fileno() not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(agent, MAX_REQUEST_BYTES, 2)
        if not data:
            return  # the agent is gone or done
        request = json.loads(data)
        assert len(fds) == 2, f"a request carries stdout and stderr, got {len(fds)} fds"
        # the pid goes to the agent once the child leads its own session (it closes
        # `in_session` after setsid): a signal to that session before would miss it
        settled, in_session = os.pipe()
        pid = os.fork()
        if pid == 0:
            agent.close()
            os.close(settled)
            _run_child(request, fds[0], fds[1], in_session)
        for fd in (*fds, in_session):
            os.close(fd)
        os.read(settled, 1)  # EOF: the child is in its session, or already gone
        os.close(settled)
        agent.send(json.dumps({"pid": pid}).encode())
        _reap(agent)


def _serve_agent(agent: socket.socket) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        serve(agent)  # raises when the agent died: its workers carry on, as when it stops


def listen(path: str) -> None:
    """Fork a zygote for each agent that connects to `path`, until killed."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the agents' zygotes
    while True:
        agent, _ = server.accept()
        if os.fork() == 0:
            code = 1
            try:
                server.close()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _serve_agent(agent)  # sets its own SIGCHLD handler: it reaps its workers
                code = 0
            finally:
                os._exit(code)
        agent.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fork wstrain workers for an agent")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--fd", type=int, help="the agent's socket")
    where.add_argument("--listen", help="serve every agent that connects to this socket path")
    args = parser.parse_args(argv)
    if args.listen:
        listen(args.listen)
    else:
        _serve_agent(socket.socket(fileno=args.fd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
