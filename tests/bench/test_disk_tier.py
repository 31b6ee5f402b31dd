"""bench/disk_tier.py's prediction on the CPU (the table of RESULTS.md's Model size comes
from it): the disk row holds the state over its host budget asked for, spills, and is
predicted slower than all state in memory by less as the step grows; a preset too large for
any host budget of its own plans its disk row alone.

    pytest tests/bench/test_disk_tier.py
"""

from __future__ import annotations

import argparse

import pytest

from bench.disk_tier import predict


def _args(**over: object) -> argparse.Namespace:
    args = dict(
        model=None, layers=56, seq=8192, global_batch=8, steps=3, host_gib=110.0,
        state_over_host=1.5, disk_gib=60.0, disk_host_gib=None, rows="in-memory,disk",
        read_gbps=1.57, write_gbps=2.2, batches="16,256",
    )  # fmt: skip
    return argparse.Namespace(**(args | over))


def test_the_disk_row_is_predicted_slower_by_less_as_the_step_grows() -> None:
    short, long = predict(_args())
    for row in (short, long):
        assert row["state_over_host"] == pytest.approx(1.5, abs=1e-3)
        assert row["spilled_layers"] > 0
        assert 0 < row["predicted_x_in_memory"] < 1
    assert short["predicted_x_in_memory"] < long["predicted_x_in_memory"]
    # a faster disk, the same job: a faster disk row
    fast = predict(_args(read_gbps=7.0, write_gbps=5.0, batches="16"))[0]
    assert fast["predicted_step_seconds_disk"] < short["predicted_step_seconds_disk"]


def test_qwen3_32b_plans_its_disk_row_at_180_gib_of_host() -> None:
    (row,) = predict(_args(model="qwen3-32b", disk_host_gib=180.0, disk_gib=110.0,
                           rows="disk", batches="16"))  # fmt: skip
    assert row["layers"] == 64 and row["params"] > 32e9
    assert row["state_over_host"] > 1.3 and 0 < row["spilled_layers"] < 64
    assert "predicted_x_in_memory" not in row  # no host holds its whole state
