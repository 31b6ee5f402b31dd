"""Shared fixtures: a private real redis-server, a real uvicorn API and a real scheduler agent
(which launches real worker processes), all on loopback.

    pytest -m "not slow"     # skip the end-to-end tests that train real jobs
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

# One BLAS/OpenMP thread per test process: CI runs two xdist workers on 2 cores, and a torch
# that takes both cores in each worker runs 4 threads on 2 cores, each matmul waiting on the
# other worker's. Set before torch is imported; os.environ also reaches every process the
# fixtures spawn (API, agent, workers), which copy it.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# An xdist worker starts with COLUMNS=80 where a serial pytest has none; the CLI sizes its
# tables by it (160 wide in a pipe without it), so under xdist an 80-wide `wstrain ls` would
# cut the names the CLI tests look for. A worker's environment is the serial run's.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

# Service-side imports (redis, uvicorn) happen inside the fixtures, so GPU-only tests run
# on a machine that has torch but not the service's dependencies.

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "examples" / "data" / "python-docs.txt"
TERMINAL = {"succeeded", "failed", "cancelled", "timeout"}


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.ports import free_port
    from wstrain.cli.serve import start_redis

    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed; run scripts/test.sh, which installs it")
    port = free_port()
    proc = start_redis(tmp_path_factory.mktemp("redis"), port)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


SLOWEST_FIRST = Path(__file__).with_name("slowest_modules.txt")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest modules first (tests/slowest_modules.txt). Under --dist loadscope xdist
    re-sorts the modules by their number of tests (its default), so this order breaks ties
    there and orders a serial run (the file's header has the measurement)."""
    lines = SLOWEST_FIRST.read_text().splitlines()
    paths = [line.split()[0] for line in lines if line.strip() and not line.startswith("#")]
    rank = {path: i for i, path in enumerate(paths)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer in {timeout_s} s")


@dataclass
class Stack:
    """A running wstrain: API at `url`, optional agent, shared Redis, one key prefix."""

    url: str
    env: dict[str, str]
    state_dir: Path
    api: subprocess.Popen[bytes]
    agent: subprocess.Popen[bytes] | None
    port: int
    metrics_port: int  # the agent's /metrics

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def start_api(self) -> None:
        self.api = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "wstrain.api.app:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            env=self.env,
            cwd=REPO,
        )
        _wait_http(f"{self.url}/healthz", self.api)

    def stop(self) -> None:
        for proc in (self.agent, self.api):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()


_NODE_PROFILES: list[Path] = []  # this process's measured profile cache, once measured


def seed_node_profile(state_dir: Path) -> None:
    """Give `state_dir` the hardware profile this test process measured once, as the agent's
    own cache would hold it after a first start: an agent measures one in a new state dir
    (torch's import and about 2 s of timing on 2 cores, 7 s under load), and the suite
    starts an agent in over 20 stacks, each on the same machine."""
    if not _NODE_PROFILES:
        cache = Path(tempfile.mkdtemp(prefix="wstrain-profile-"))
        atexit.register(shutil.rmtree, cache, True)
        subprocess.run(
            [sys.executable, "-m", "wstrain.worker.profile.node", "--cache-dir", str(cache)],
            check=True,
            stdout=subprocess.DEVNULL,
            cwd=REPO,
        )
        _NODE_PROFILES.append(cache)
    shutil.copytree(_NODE_PROFILES[0], state_dir / "profiles", dirs_exist_ok=True)


_ZYGOTE_SERVERS: list[tuple[subprocess.Popen[bytes], str]] = []  # this process's, once started


def zygote_server() -> str:
    """The socket of this test process's worker zygote server (worker/zygote.py --listen):
    each agent make_stack starts forks its zygote from it, where its own would import torch
    again (2.9 CPU-s on CI's 2 cores, an agent in over 25 stacks)."""
    if not _ZYGOTE_SERVERS or _ZYGOTE_SERVERS[0][0].poll() is not None:
        path = os.path.join(tempfile.mkdtemp(prefix="wz-"), "zygote.sock")  # < 108 bytes
        proc = subprocess.Popen(
            [sys.executable, "-m", "wstrain.worker.zygote", "--listen", path],
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            assert proc.poll() is None, "the zygote server exited at start"
            assert time.monotonic() < deadline, "the zygote server did not listen in 60 s"
            time.sleep(0.05)
        atexit.register(proc.terminate)
        _ZYGOTE_SERVERS[:] = [(proc, path)]
    return _ZYGOTE_SERVERS[0][1]


def make_stack(
    redis_url: str,
    tmp: Path,
    prefix: str,
    with_agent: bool,
    extra_env: dict[str, str] | None = None,
) -> Stack:
    from tests.ports import free_port

    port, metrics_port = free_port(), free_port()
    env = dict(os.environ)
    env.update(
        WSTRAIN_REDIS_URL=redis_url,
        WSTRAIN_KEY_PREFIX=prefix,
        WSTRAIN_STATE_DIR=str(tmp / "state"),
        WSTRAIN_CPU_SLOTS="2",
        WSTRAIN_WORKER_THREADS="1",
        WSTRAIN_NODE_NAME=f"node-{prefix}",
        WSTRAIN_DATA_ROOTS=json.dumps([str(REPO), str(tmp)]),
        WSTRAIN_HEARTBEAT_S="0.5",
        WSTRAIN_METRICS_PORT=str(metrics_port),
        PYTHONPATH=str(REPO),
    )
    env.update(extra_env or {})
    if env.get("WSTRAIN_WORKER_ZYGOTE", "true").lower() not in ("0", "false"):  # any agent
        env.setdefault("WSTRAIN_WORKER_ZYGOTE_SOCKET", zygote_server())
    stack = Stack(
        f"http://127.0.0.1:{port}",
        env,
        tmp / "state",
        None,
        None,  # type: ignore[arg-type]
        port,
        metrics_port,
    )
    stack.start_api()
    if env.get("WSTRAIN_PROFILE_CACHE", "true").lower() not in ("0", "false"):
        seed_node_profile(tmp / "state")
    if with_agent:
        stack.agent = subprocess.Popen(
            [sys.executable, "-m", "wstrain.agent.agent"], env=env, cwd=REPO
        )
        deadline = time.monotonic() + 60
        with stack.client() as c:
            while not c.get("/v1/nodes").json()["nodes"]:
                assert stack.agent.poll() is None, "agent exited during start-up"
                assert time.monotonic() < deadline, "agent did not register in 60 s"
                time.sleep(0.2)
    return stack


def bearer(token: str) -> dict[str, str]:
    """The Authorization header that speaks for `token`."""
    return {"Authorization": f"Bearer {token}"}


def secured_stack(
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    prefix: str,
    tokens: dict[str, Any],
    extra_env: dict[str, str] | None = None,
) -> Stack:
    """An API with WSTRAIN_API_TOKENS = `tokens` over a registered CPU node, no agent."""
    s = make_stack(
        redis_url,
        tmp_path_factory.mktemp(prefix),
        prefix,
        with_agent=False,
        extra_env={"WSTRAIN_API_TOKENS": json.dumps(tokens), **(extra_env or {})},
    )
    register_node(redis_url, prefix)
    return s


@pytest.fixture(scope="session")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """API + agent: submitted jobs really train."""
    s = make_stack(redis_url, tmp_path_factory.mktemp("full"), "full", with_agent=True)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def leave_the_queue_as_found(api_only: Stack) -> Iterator[None]:
    """api_only is shared by the session: cancel the jobs this module left queued there, so
    the next module's queue listings start from what it submits."""
    started = time.time()
    yield
    with api_only.client() as c:
        queued = c.get("/v1/jobs", params={"state": "queued", "limit": 500}).json()["jobs"]
        for job in queued:
            if job["created_at"] >= started:
                c.post(f"/v1/jobs/{job['id']}/cancel")


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port a listening test socket holds for the test's length."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def register_node(redis_url: str, prefix: str) -> None:
    """A 16 GiB CPU node heartbeated as an agent does (for a day), so budgets check against
    a node while no agent runs (jobs stay queued)."""
    from bench.api_load import register_node as hold

    hold(redis_url, prefix, "fake-capacity", 16 << 30)


@pytest.fixture(scope="session")
def api_only(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """API with no agent: submitted jobs stay queued, so queue-side behaviour is testable."""
    s = make_stack(redis_url, tmp_path_factory.mktemp("apionly"), "apionly", with_agent=False)
    register_node(redis_url, "apionly")
    with s.client() as c:
        assert c.get("/v1/nodes").json()["nodes"]
    yield s
    s.stop()


def tiny_spec(name: str, **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "model": {"preset": "micro-llama"},
        "data": {"kind": "text", "path": str(CORPUS), "tokenizer": "byte"},
        "seq_len": 32,
        "global_batch": 4,
        "steps": 40,
        "optimizer": {"lr": 3e-3, "warmup_steps": 5},
        "precision": "fp32",
        "budget": {"device_gib": 1, "host_gib": 2},
        "checkpoint_every": 0,
        "seed": 1,
    }
    spec.update(over)
    return spec


def wait_job(c: httpx.Client, job_id: str, pred: Any, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = c.get(f"/v1/jobs/{job_id}").json()
        if pred(job):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} never met the condition; last: {job}")
        time.sleep(0.05)


def wait_terminal(c: httpx.Client, job_id: str, timeout_s: float = 180) -> dict[str, Any]:
    return wait_job(c, job_id, lambda j: j["state"] in TERMINAL, timeout_s)
