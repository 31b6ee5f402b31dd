"""`wstrain serve`: the API in this process, one scheduler agent as a child process, and a
private `redis-server` child (persisting to STATE_DIR/redis with AOF) when REDIS_URL is unset.
One settings object (WSTRAIN_*, --state-dir over WSTRAIN_STATE_DIR) serves all of them: the
API here guards the state dir and data roots the agent and its workers use.
Stopping it (Ctrl-C / SIGTERM) stops the agent first, which checkpoints and requeues running
jobs, then Redis.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis
import uvicorn
from pydantic import ValidationError

from wstrain.api.app import create_app
from wstrain.api.settings import ServiceSettings

log = logging.getLogger(__name__)

# the agent's exit code when a setting must change first (agent/exporter.py's
# EXIT_CONFIG, sysexits.h EX_CONFIG): starting it again would fail the same way every 1..60 s
AGENT_EXIT_CONFIG = 78


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    """A private redis-server on loopback, persisting to data_dir; waits until it answers."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit(
            "wstrain: redis-server is not installed and REDIS_URL is unset; "
            "install it (apt-get install redis-server) or set REDIS_URL"
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data_dir),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--protected-mode",
            "yes",
        ],
        stdout=open(data_dir / "redis.log", "ab"),  # noqa: SIM115 - the child owns it
        stderr=subprocess.STDOUT,
        # its own session: a terminal's Ctrl-C reaches `wstrain serve` alone, which stops
        # Redis last, after the agent has checkpointed and requeued its jobs into it
        start_new_session=True,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return proc
        except redis.ConnectionError as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"wstrain: redis-server did not start; see {data_dir}/redis.log"
                ) from exc
            time.sleep(0.05)


def check_metrics_port(host: str, port: int) -> None:
    """Refuse, in one line and before anything starts, a metrics port the agent could not
    bind (it would exit with AGENT_EXIT_CONFIG). SO_REUSEADDR as prometheus-client's server
    sets it: a port in TIME_WAIT after the last serve is free to it."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise SystemExit(
                f"wstrain serve: the agent's /metrics port {host}:{port} cannot be bound: "
                f"{exc.strerror or exc}; pass --metrics-port (or set WSTRAIN_METRICS_PORT) "
                "to a free port, or 0 to serve no /metrics"
            ) from None


class AgentKeeper:
    """Runs the scheduler agent in its own session and starts it again when it dies (after
    1, 2, 4 ... 60 s), until stop() sends it SIGTERM and waits for its checkpoints. An agent
    that exits with AGENT_EXIT_CONFIG (a setting must change: its one-line reason is on
    stderr) is not started again: `refused` is set and on_refused() is called."""

    def __init__(self, env: dict[str, str], on_refused: Callable[[], None] = lambda: None) -> None:
        self.env = env
        self.on_refused = on_refused
        self.refused = False
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="agent-keeper", daemon=True)

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wstrain.agent.agent"],
            env=self.env,
            start_new_session=True,  # Ctrl-C goes to serve, which stops the agent in order
        )

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def _watch(self) -> None:
        backoff_s = 1.0
        while not self._stopping.is_set():
            assert self.proc is not None
            started = time.monotonic()
            code = self.proc.wait()
            if self._stopping.is_set():
                return
            if code == AGENT_EXIT_CONFIG:
                log.error(
                    "agent refused to start (exit %d, its reason above); not starting it "
                    "again: change the setting and start wstrain serve again",
                    code,
                )
                self.refused = True
                self.on_refused()
                return
            if time.monotonic() - started > 60:
                backoff_s = 1.0  # it ran a while: this is a new failure, not a crash loop
            log.error("agent exited with %s; starting it again in %.0f s", code, backoff_s)
            if self._stopping.wait(backoff_s):
                return
            backoff_s = min(60.0, backoff_s * 2)
            self._spawn()

    def stop(self, timeout_s: float = 90) -> None:
        self._stopping.set()
        if self.proc is not None:
            _stop(self.proc, "agent", timeout_s)
        self._thread.join(5)


def _stop(proc: subprocess.Popen[bytes], name: str, timeout_s: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("%s did not stop in %.0f s; killing it", name, timeout_s)
        proc.kill()


def settings_for(state_dir: Path | None) -> ServiceSettings:
    """The one settings object of `wstrain serve`, from WSTRAIN_* with --state-dir over
    WSTRAIN_STATE_DIR; the state dir and data roots made absolute, so the API here and the
    agent and workers it starts (from settings.child_env()) guard the same directories."""
    try:
        settings = ServiceSettings() if state_dir is None else ServiceSettings(state_dir=state_dir)
    except ValidationError as exc:  # a root inside the state dir, a malformed WSTRAIN_*
        raise SystemExit(f"wstrain serve: the settings cannot be used: {exc}") from exc
    roots = [str(r) for r in settings.access().roots]  # real paths, as the API checks them
    real_state = Path(os.path.realpath(settings.state_dir))
    return settings.model_copy(update={"state_dir": real_state, "data_roots": roots})


def serve(host: str, port: int, state_dir: Path | None, metrics_port: int) -> int:
    """state_dir: --state-dir, None for WSTRAIN_STATE_DIR (./wstrain-state)."""
    settings = settings_for(state_dir)
    check_metrics_port(host, metrics_port)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    redis_proc = None
    if not (env.get("WSTRAIN_REDIS_URL") or env.get("REDIS_URL")):
        rport = free_port()
        redis_proc = start_redis(settings.state_dir / "redis", rport)
        settings = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{rport}/0"})
        log.info("started private redis-server on %s", settings.redis_url)
    env.update(
        settings.child_env(),  # the agent's state dir, roots and Redis are the API's
        WSTRAIN_METRICS_HOST=host,
        WSTRAIN_METRICS_PORT=str(metrics_port),
    )
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host=host, port=port, log_level="info")
    )
    # a refusing agent stops the API too: a server with no agent would queue jobs forever
    keeper = AgentKeeper(env, on_refused=lambda: setattr(server, "should_exit", True))
    keeper.start()
    # uvicorn re-raises SIGTERM/SIGINT once it has shut down; with these no-op handlers in
    # place that lands here instead of killing the process, so the children stop cleanly.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run()
    finally:
        # the API has stopped taking work; now the agent checkpoints and requeues, then Redis
        keeper.stop()
        if redis_proc is not None:
            _stop(redis_proc, "redis-server", 10)
    if keeper.refused:
        return AGENT_EXIT_CONFIG
    return 0 if server.started else 3  # as uvicorn.run exits when the API never started
