"""The scheduler agent as a real process on a real Redis: one node name, one live agent.

pytest -m slow tests/agent/test_agent.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, make_stack

pytestmark = pytest.mark.slow


def test_a_second_agent_with_a_live_agents_node_name_is_refused(
    redis_url: str, tmp_path: Path
) -> None:
    stack = make_stack(redis_url, tmp_path, "twins", with_agent=True)
    try:
        assert stack.agent is not None
        second = subprocess.run(
            [sys.executable, "-m", "wstrain.agent.agent"],
            env={**stack.env, "WSTRAIN_METRICS_PORT": "0"},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode != 0
        assert "node name 'node-twins' is held by a live agent" in second.stderr
        assert f"pid {stack.agent.pid}" in second.stderr
        assert stack.agent.poll() is None  # the first one runs on, still the node's holder
        nodes = httpx.get(f"{stack.url}/v1/nodes", timeout=10).json()["nodes"]
        assert [(n["name"], n["agent_pid"]) for n in nodes] == [("node-twins", stack.agent.pid)]
    finally:
        stack.stop()
