"""agent/hardware.py spill_space: at the agent's start (after its first reap, no worker of
its node running) the spill directory's job subdirectories a SIGKILLed worker or a previous
agent process left are removed before its free space is counted; nothing else there is
touched.

    pytest tests/agent/test_spill_space.py
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path

from wstrain.agent.hardware import spill_space


def test_a_killed_jobs_spill_file_is_removed_before_the_space_is_counted(tmp_path: Path) -> None:
    left = tmp_path / uuid.uuid4().hex[:12]  # a job id as store/job_store.py makes them
    left.mkdir()
    (left / "moments.bin").write_bytes(b"\0" * (1 << 20))
    keep = [tmp_path / "not-a-job", tmp_path / "0123456789ab.txt"]
    keep[0].mkdir()
    keep[1].write_text("an operator's file")
    free = asyncio.run(spill_space(tmp_path, {"disk_read_bytes_per_s": 1e9}))
    assert not left.exists()
    assert all(p.exists() for p in keep)
    assert 0 < free <= shutil.disk_usage(tmp_path).free + (1 << 20)
