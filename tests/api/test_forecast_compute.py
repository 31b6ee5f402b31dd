"""api/forecast.py's compute(), the store's rows into the queue forecast: a stopped job
leaves after its step in flight (half a step on average) and its checkpoint. A cancelled
job ends even its first step (the plan's step then); a preempted one is waited for only
once it has reported a step of this run, as the agent's SIGKILL deadline does
(agent/stops.py).

    pytest tests/api/test_forecast_compute.py
"""

from __future__ import annotations

import pytest

from wstrain.api.forecast import STOP_S, compute
from wstrain.contracts.calibration import GIB
from wstrain.contracts.jobs import GPUInfo, JobState, Node
from wstrain.policy import PolicyConfig
from wstrain.store.scheduling import PendingRow, PlacedRow, ProgressRow

NOW = 10_000.0
NODE = Node(
    name="n",
    device="cuda",
    gpus=[GPUInfo(index=0, name="H200", total_bytes=100 * GIB, free_bytes=0)],
    host_total_bytes=1024 * GIB,
    host_free_bytes=1024 * GIB,
    slots=1,
    running=["r"],
    profile={},
    heartbeat_at=NOW,
)


def _start_of_u(
    state: JobState, priority: int, step_s: float | None, predicted_s: float | None
) -> float | None:
    """u (50 GiB, class 10) behind r (90 GiB of the one GPU, class `priority`, in `state`,
    1,000 steps left at `step_s` measured or `predicted_s` planned)."""
    placed = PlacedRow("r", "ben", priority, 90 * GIB, 8 * GIB, "n", 0, 0.0, state.value)
    u = PendingRow("u", "ana", 10, 1.0, 50 * GIB, 8 * GIB, False, (), 0.0)
    progress = {
        "r": ProgressRow("r", 0, 1000, step_s, predicted_s, False),
        "u": ProgressRow("u", 0, 10, None, 6.0, False),
    }
    got = compute(NOW, [u], [placed], [NODE], progress, {}, PolicyConfig(), {})
    return got["u"].start_s


def test_a_cancelled_job_leaves_after_half_its_step_even_its_first() -> None:
    assert _start_of_u(JobState.cancelling, 10, 600.0, 500.0) == pytest.approx(NOW + STOP_S + 300.0)
    assert _start_of_u(JobState.cancelling, 10, None, 500.0) == pytest.approx(NOW + STOP_S + 250.0)


def test_a_preempted_job_leaves_after_half_a_reported_step_only() -> None:
    # r of class -10 is preempted for u at once: it leaves after its step in flight
    assert _start_of_u(JobState.running, -10, 600.0, 500.0) == pytest.approx(NOW + STOP_S + 300.0)
    # no step of this run reported: the agent kills it at the grace, not waiting for one
    assert _start_of_u(JobState.running, -10, None, 500.0) == pytest.approx(NOW + STOP_S)
