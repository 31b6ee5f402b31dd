"""An agent on a host without GPUs reads its cached node profile without starting the
profiling child (agent/hardware.py): the key it computes without torch must be the key the
child wrote, or every start would measure again.

    pytest tests/agent/test_profile_cache.py
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from wstrain.agent.hardware import _cached_cpu_profile, measure_node


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="a GPU host profiles in the child")
def test_a_cpu_hosts_cached_profile_is_read_under_the_childs_key(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    assert _cached_cpu_profile(profiles) is None  # nothing cached: the child measures
    out = subprocess.run(
        [sys.executable, "-m", "wstrain.worker.profile.node", "--cache-dir", str(profiles)],
        check=True,
        capture_output=True,
        text=True,
    )
    child = json.loads(out.stdout)
    assert not child.get("cached")
    assert child["profile"]["loss_logits_per_s"] > 0  # the loss's rate, for the planner
    found = asyncio.run(measure_node(tmp_path, use_cache=True))
    assert found.cached and found.key == child["key"] and found.device == "cpu"
    assert found.profile == child["profile"] and found.gpus == []
    (profiles / f"{child['key']}.json").write_text("{")  # a torn cache file: measure again
    assert _cached_cpu_profile(profiles) is None
