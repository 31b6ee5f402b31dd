"""The ranks of a data-parallel job on one node, started and watched as torchrun would.

The worker the agent starts is rank 0 (Plan.ranks > 1). Before it builds anything it
starts ranks 1..N-1 as its own children — the same command, torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), one per GPU the agent
made visible — and the gang lives and dies together:
- a rank that fails kills the gang: rank 0 reports the error and exits failed (the agent
  retries from the last checkpoint per the job's max_retries); NCCL would otherwise wait
  out its collective timeout for the dead peer;
- rank 0 dying takes its children with it (PR_SET_PDEATHSIG), even under SIGKILL;
- a SIGTERM to rank 0 (cancel, preemption, time limit) reaches every rank at the next step
  boundary through one collective (worker/main.py), so all stop at the same step and rank
  0 writes the checkpoint.
Only rank 0 reports to the agent; the others log to the same worker.log.
On a host without a GPU, ranks 1..N-1 fork from rank 0 before it has built anything (no
threads yet): a rank costs milliseconds instead of a fresh interpreter's torch import (3.3
CPU-s on the 2-core CI machine, 11 ranks a test run); on a GPU host they are exec'd.

Several nodes (Spec.nodes > 1): the agent of each member node starts one worker with
NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT (node 0's address and a port it chose); that
worker is its node's local rank 0, global rank NODE_RANK x gpus, and starts its node's
local ranks 1..gpus-1 the same way. Only global rank 0 (node 0's worker) reports and writes
checkpoints; the other nodes' workers train in step and exit 0 with it (their agents wait
for node 0's result; a non-zero exit of any of them fails the attempt, agent/members.py).

    gang = RankGang.start(world=2, argv=sys.argv[1:], on_death=report_and_exit)
    ...train...; gang.join()
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# how often rank 0 looks at its children: a dead rank stops the gang within this
WATCH_INTERVAL_S = 0.5
# how long rank 0 waits for the others to finish once its own work is done
JOIN_TIMEOUT_S = 120.0
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In a child before exec: SIGKILL when rank 0 exits, however it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_env(rank: int, world: int, port: int, node: NodeOf | None = None) -> dict[str, str]:
    """torchrun's variables for local rank `rank` of `world` ranks on this node; with `node`,
    of that node of several (global rank node_rank x world + rank)."""
    if node is None:
        node = NodeOf(nodes=1, node_rank=0, master_addr="127.0.0.1", master_port=port)
    return {
        "RANK": str(node.node_rank * world + rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(node.nodes * world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": node.master_addr,
        "MASTER_PORT": str(node.master_port),
    }


@dataclass(frozen=True)
class NodeOf:
    """This worker's node among the job's nodes, as its agent set it (NNODES, NODE_RANK,
    MASTER_ADDR, MASTER_PORT: node 0's advertised address and the port it chose)."""

    nodes: int
    node_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_env(cls) -> NodeOf | None:
        """None when the agent started a one-node job (NNODES unset or 1)."""
        nodes = int(os.environ.get("NNODES", "1"))
        if nodes <= 1:
            return None
        node_rank = int(os.environ["NODE_RANK"])
        if not 0 <= node_rank < nodes:
            raise ValueError(f"NODE_RANK={node_rank} is outside 0..NNODES-1 ({nodes} nodes)")
        return cls(nodes, node_rank, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))


def rank_of_env(ranks_per_node: int = 1) -> int:
    """This process's global rank: RANK when it was started as a rank, else its node's
    first (NODE_RANK x ranks_per_node), else 0."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    node = NodeOf.from_env()
    return node.node_rank * ranks_per_node if node else 0


class ForkedRank:
    """A rank forked from rank 0, watched as a `subprocess.Popen` is: pid, poll, wait, kill."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()  # the watcher thread and the main thread both reap

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: it is gone, how is unknown
                    pid, status = self.pid, 1 << 8
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        return code

    def kill(self) -> None:
        with self._lock:
            if self.returncode is None:  # not reaped: the pid is still this rank's
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)


RankProcess = subprocess.Popen[bytes] | ForkedRank


RunRank = Callable[[list[str]], int]  # worker/main.py's main: what a rank runs


def _fork_rank(argv: list[str], env: dict[str, str], run_rank: RunRank) -> ForkedRank:
    """Fork this process (rank 0, nothing built yet) into the rank `env` names, running
    `run_rank(ARGV)` as `python -m wstrain.worker.main ARGV` would, stdout to /dev/null."""
    for stream in (sys.stdout, sys.stderr):  # else the child writes rank 0's buffer again
        stream.flush()
    pid = os.fork()
    if pid:
        return ForkedRank(pid)
    code = 1
    try:
        _die_with_parent()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # rank 0's handler is for its Worker
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)  # only rank 0 reports to the agent
        os.close(null)
        os.environ.clear()
        os.environ.update(env)
        code = run_rank(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        logging.getLogger(__name__).exception("rank %s crashed", env.get("RANK"))
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _exec_rank(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "wstrain.worker.main", *argv],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # only rank 0 reports to the agent
        preexec_fn=_die_with_parent,  # prctl only: safe between fork and exec
    )


def _can_fork() -> bool:
    """Forking is safe before CUDA is initialised and while rank 0 runs one thread. On a
    host with a GPU the ranks are exec'd all the same: the forked path is measured on CPU
    hosts only (the test suite's 11 ranks), the exec'd one on the lent GPUs."""
    import torch  # imported by rank 0 already

    if torch.cuda.is_available():
        return False
    return not torch.cuda.is_initialized() and threading.active_count() == 1


class RankGang:
    def __init__(self, children: list[RankProcess], on_death: Callable[[str], None]):
        self.children, self.on_death = children, on_death
        self.finishing = False  # rank 0's own work is done: children may exit now
        self._watch = threading.Thread(target=self._run, name="rank-watch", daemon=True)
        self._watch.start()

    @classmethod
    def start(
        cls,
        world: int,
        argv: list[str],
        on_death: Callable[[str], None],
        node: NodeOf | None = None,
        run_rank: RunRank | None = None,
    ) -> RankGang:
        """Become local rank 0 of `world` on this node and start the others with `argv`
        (this worker's own arguments); with `node`, on that node of several, at its master
        address and port (else a free port here). `on_death(reason)` runs on the watcher
        thread when a rank dies early; it must end the process. With `run_rank` (the
        worker's main) the ranks fork from this process while that is safe, else exec."""
        port = node.master_port if node else _free_port()
        os.environ.update(torchrun_env(0, world, port, node))
        children: list[RankProcess] = []
        fork = run_rank is not None and _can_fork()
        for rank in range(1, world):
            env = {**os.environ, **torchrun_env(rank, world, port, node)}
            if run_rank is not None and fork:
                children.append(_fork_rank(argv, env, run_rank))
            else:
                children.append(_exec_rank(argv, env))
        log.info(
            "rank 0 of %d: started ranks %s (%s)",
            world,
            [c.pid for c in children],
            "forked" if fork else "exec'd",
        )
        return cls(children, on_death)

    def _run(self) -> None:
        while not self.finishing:
            time.sleep(WATCH_INTERVAL_S)
            reason = self.dead()
            if reason is not None and not self.finishing:
                self.kill()
                self.on_death(reason)
                return

    def dead(self, wait_s: float = 0.0) -> str | None:
        """Why the gang is broken: the first rank found exited (waiting up to `wait_s` for
        one: rank 0's collective can fail on a dead peer before the peer is reaped)."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, child in enumerate(self.children, start=1):
                code = child.poll()
                # 0: it trained its last step (or stopped at the step every rank stopped
                # at) and rank 0 is still writing the checkpoint
                if code not in (None, 0):
                    return (
                        f"rank {rank} (pid {child.pid}) died with exit code {code} (its "
                        "error is in the job's worker log)"
                    )
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def kill(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()

    def join(self) -> None:
        """Rank 0 is done: wait for the others (each ends its last step with it)."""
        self.finishing = True
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for child in self.children:
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("rank pid %d still running after rank 0 ended: killed", child.pid)
                child.kill()
