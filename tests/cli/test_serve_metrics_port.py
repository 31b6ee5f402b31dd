"""`wstrain serve` and a busy metrics port: serve refuses it in one line before it
starts anything, and its agent keeper does not restart an agent that refused its settings
(exit 78) but stops, so no restart loop prints a traceback every 1..60 s. Real processes, a
port a test socket holds, the session's real Redis.

    pytest tests/cli/test_serve_metrics_port.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import REPO
from tests.ports import free_port
from wstrain.cli.serve import AGENT_EXIT_CONFIG, AgentKeeper


def test_serve_refuses_a_busy_metrics_port_in_one_line(tmp_path: Path, held_port: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSTRAIN_")}
    env.update(WSTRAIN_REDIS_URL="redis://127.0.0.1:9/0", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "wstrain.cli.main", "serve", "--port", str(free_port())]
    cmd += ["--state-dir", str(tmp_path / "state"), "--metrics-port", str(held_port)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"wstrain serve: the agent's /metrics port 127.0.0.1:{held_port} cannot be bound: "
        "Address already in use; pass --metrics-port (or set WSTRAIN_METRICS_PORT) to a free "
        "port, or 0 to serve no /metrics"
    )
    assert not (tmp_path / "state").exists()  # nothing was started


def test_the_keeper_does_not_restart_an_agent_that_refused_its_settings(
    redis_url: str, tmp_path: Path, held_port: int
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSTRAIN_")}
    env.update(
        WSTRAIN_REDIS_URL=redis_url,
        WSTRAIN_KEY_PREFIX="keeper",
        WSTRAIN_STATE_DIR=str(tmp_path / "state"),
        WSTRAIN_NODE_NAME="node-keeper",
        WSTRAIN_DATA_ROOTS=f'["{tmp_path}"]',
        WSTRAIN_METRICS_HOST="127.0.0.1",
        WSTRAIN_METRICS_PORT=str(held_port),
        PYTHONPATH=str(REPO),
    )
    refused = threading.Event()
    keeper = AgentKeeper(env, refused.set)
    keeper.start()
    try:
        assert refused.wait(120), "the agent did not refuse the busy port"
        first = keeper.proc
        time.sleep(1.5)  # past the keeper's first backoff of 1 s
        assert keeper.proc is first and first is not None
        assert first.returncode == AGENT_EXIT_CONFIG and keeper.refused
    finally:
        keeper.stop(10)
