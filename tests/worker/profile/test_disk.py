"""worker/profile/disk.py: the spill directory's read and write rates, and both ways in the
spill's order, over direct I/O and the buffered fallback, leave nothing behind; `python -m
wstrain.worker.profile.node --spill-dir DIR` adds them to the profile it prints, measured
again on a cached profile (the directory is no part of the cache key).

    pytest tests/worker/profile/test_disk.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wstrain.contracts.calibration import MIB
from wstrain.contracts.hardware import NodeProfile
from wstrain.worker.profile.disk import disk_bandwidth

KEYS = {"disk_read_bytes_per_s", "disk_write_bytes_per_s", "disk_both_bytes_per_s"}


@pytest.mark.parametrize("buffered", [False, True], ids=["direct", "buffered"])
def test_disk_rates_leave_no_file(tmp_path: Path, buffered: bool) -> None:
    rates = disk_bandwidth(tmp_path / "spill", 16 * MIB, buffered=buffered)
    assert set(rates) == KEYS
    # a disk, not a memcpy: between 1 MB/s and 1 TB/s
    assert all(1e6 < r < 1e12 for r in rates.values()), rates
    assert list((tmp_path / "spill").iterdir()) == []


def test_the_agents_command_prints_the_rates(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "wstrain.worker.profile.disk", "--dir", str(tmp_path)]
    out = subprocess.run([*argv, "--mib", "16"], capture_output=True, check=True).stdout
    rates = json.loads(out)
    assert set(rates) == KEYS and all(r > 1e6 for r in rates.values())
    assert list(tmp_path.iterdir()) == []


def test_the_node_profile_measures_the_spill_dir_each_time(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "wstrain.worker.profile.node", "--cache-dir", str(tmp_path)]
    first = json.loads(subprocess.run(argv, capture_output=True, check=True).stdout)
    assert not KEYS & set(first)  # no spill dir, no disk rates
    argv += ["--spill-dir", str(tmp_path / "spill")]
    found = json.loads(subprocess.run(argv, capture_output=True, check=True).stdout)
    assert found.get("cached") is True and set(found) >= KEYS
    assert not KEYS & set(json.loads(next(tmp_path.glob("*.json")).read_text()))
    measured = {k: v for k, v in found.items() if isinstance(v, float)}
    node = NodeProfile.from_profile("cpu", measured, 1 << 30, 1 << 30)
    assert node.disk_read_bytes_per_s == found["disk_read_bytes_per_s"] > 0
    assert node.disk_both_bytes_per_s == found["disk_both_bytes_per_s"] > 0
