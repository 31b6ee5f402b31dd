"""bench/queue_events.py's usage accounting: the GPU-seconds charged to the owners (what the
fair-share factor balances) are the GPU-seconds their jobs held, including the run up to the
instant a job ends, is preempted, or is shrunk and restarted.

    pytest tests/bench/test_queue_events.py
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from bench.queue_events import QueueSim, run_sim
from bench.queue_ranges import ranges_of
from bench.queue_trace import NODE, OWNERS, QUOTAS, TraceJob, make_trace
from wstrain.contracts.calibration import GIB
from wstrain.policy import PolicyConfig
from wstrain.policy.state import BudgetPoint

# no decay over the simulated days (~2 of them): charged usage is then plain GPU-seconds
NO_DECAY = 1e15


class _HeldSim(QueueSim):
    """The simulation with each owner's held GPU-seconds integrated over the whole run,
    independently of `policy.charge`: Σ over its jobs of weight × time held."""

    def __init__(
        self,
        trace: Sequence[TraceJob],
        config: PolicyConfig,
        ranges: Mapping[str, tuple[BudgetPoint, ...]] | None = None,
    ) -> None:
        super().__init__(trace, config, NODE, ranges)
        self.held_gpu_s = dict.fromkeys(OWNERS, 0.0)

    def _advance(self, to_s: float) -> None:
        for j in self._holding():
            self.held_gpu_s[j.spec.owner] += self.weight(j) * (to_s - self.now_s)
        super()._advance(to_s)


def test_a_lone_job_is_charged_for_its_whole_run() -> None:
    job = TraceJob("a", "ana", 0, 0.0, 12 * GIB, 24 * GIB, False, 3600.0)
    sim = run_sim([job], PolicyConfig(half_life_s=NO_DECAY))
    assert sim.jobs["a"].end_s == 3600.0
    assert sim.usage["ana"].gpu_s == pytest.approx(3600.0 * 12 / 141)


@pytest.mark.parametrize("ranged", [False, True], ids=["fixed", "ranged"])
def test_the_usage_charged_is_the_gpu_seconds_held(ranged: bool) -> None:
    trace = make_trace(7, jobs_per_owner=20)
    sim = _HeldSim(
        trace,
        PolicyConfig(half_life_s=NO_DECAY, quotas=QUOTAS),
        ranges_of(trace) if ranged else None,
    )
    sim.run()
    assert sim.preempted + sim.shrunk > 0  # the stops whose run up to them must be charged
    for owner in OWNERS:
        assert sim.usage[owner].gpu_s == pytest.approx(sim.held_gpu_s[owner], rel=1e-9), owner
