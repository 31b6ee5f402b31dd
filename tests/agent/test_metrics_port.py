"""A busy metrics port stops the agent with one line that names the port and the setting,
and an exit code `wstrain serve` does not restart: a real agent process, on the
session's real Redis, against a port a test socket holds.

    pytest tests/agent/test_metrics_port.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from wstrain.agent.exporter import EXIT_CONFIG


def agent_env(redis_url: str, tmp: Path, prefix: str, metrics_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSTRAIN_")}
    env.update(
        WSTRAIN_REDIS_URL=redis_url,
        WSTRAIN_KEY_PREFIX=prefix,
        WSTRAIN_STATE_DIR=str(tmp / "state"),
        WSTRAIN_NODE_NAME=f"node-{prefix}",
        WSTRAIN_DATA_ROOTS=f'["{tmp}"]',
        WSTRAIN_METRICS_HOST="127.0.0.1",
        WSTRAIN_METRICS_PORT=str(metrics_port),
        PYTHONPATH=str(REPO),
    )
    return env


def test_a_busy_metrics_port_exits_with_one_line_naming_port_and_setting(
    redis_url: str, tmp_path: Path, held_port: int
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "wstrain.agent.agent"],
        env=agent_env(redis_url, tmp_path, "busyport", held_port),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"wstrain-agent: cannot serve /metrics on 127.0.0.1:{held_port}")
    assert "WSTRAIN_METRICS_PORT" in last and "0 to serve no /metrics" in last
