"""The queue forecast (policy/forecast.py, policy/replay.py): exact predicted starts on one
GPU, an exclusive job waiting for a whole GPU, a dependency, a back-off, a gang, a quota, a
preemption, and a job no node fits.

    pytest tests/policy/test_forecast.py
"""

from __future__ import annotations

from wstrain.contracts.calibration import GIB
from wstrain.contracts.jobs import JobState
from wstrain.policy import (
    BudgetPoint,
    Gpu,
    NodeState,
    PendingJob,
    PolicyConfig,
    Quota,
    RunningJob,
)
from wstrain.policy.forecast import ForecastNode, forecast, run_seconds

NOW = 1_000.0
ONE_GPU = NodeState((Gpu(0, 100 * GIB),), 1024 * GIB)


def _p(jid: str, dev_gib: int, submitted_s: float, **kw: object) -> PendingJob:
    return PendingJob(jid, "ana", 0, submitted_s, dev_gib * GIB, 8 * GIB, **kw)  # type: ignore[arg-type]


def _r(jid: str, dev_gib: int, gpu: int = 0, exclusive: bool = False) -> RunningJob:
    return RunningJob(jid, "ben", 0, gpu, dev_gib * GIB, 8 * GIB, 0.0, exclusive)


def test_run_seconds_is_remaining_steps_times_step_time_never_negative() -> None:
    assert run_seconds(100, 0.5) == 50.0
    assert run_seconds(-3, 0.5) == 0.0  # a job past its steps ends now
    assert run_seconds(10, None) is None


def test_three_jobs_behind_two_running_ones_start_as_room_frees() -> None:
    # GPU of 100 GiB: r1 (60 GiB) ends at +100 s, r2 (30 GiB) at +300 s; 10 GiB free now
    node = ForecastNode("n", ONE_GPU, (_r("r1", 60), _r("r2", 30)))
    pending = [_p("a", 50, 1.0), _p("b", 40, 2.0), _p("c", 10, 3.0)]
    got = forecast(
        NOW,
        pending,
        [node],
        {"r1": NOW + 100, "r2": NOW + 300},
        {"a": 500.0, "b": 50.0, "c": 1000.0},
    )
    # a: 50 GiB fits once r1 ends; b: 40 GiB beside r2 (30) and a (50) only once r2 ends;
    # c: 10 GiB would fit now, but the one GPU drains for a (the round's first blocked job),
    # then for b, as the policy's rounds do: it starts beside b
    assert (got["a"].start_s, got["a"].end_s) == (NOW + 100, NOW + 600)
    assert (got["b"].start_s, got["b"].end_s) == (NOW + 300, NOW + 350)
    assert (got["c"].start_s, got["c"].end_s) == (NOW + 300, NOW + 1300)
    assert got["a"].node == "n" and got["a"].reason == ""


def test_a_job_behind_does_not_take_room_the_job_ahead_is_booked_for() -> None:
    node = ForecastNode("n", ONE_GPU, (_r("r1", 60),))
    got = forecast(
        NOW, [_p("a", 80, 1.0), _p("b", 30, 2.0)], [node], {"r1": NOW + 100}, {"a": 100, "b": 500}
    )
    # b fits now (40 free) but would still run when a starts at +100: it waits for a's end
    assert got["a"].start_s == NOW + 100
    assert got["b"].start_s == NOW + 200


def test_an_exclusive_job_waits_for_a_whole_gpu() -> None:
    node = NodeState((Gpu(0, 100 * GIB), Gpu(1, 100 * GIB)), 1024 * GIB)
    running = (_r("r0", 10, gpu=0), _r("r1", 5, gpu=1))
    got = forecast(
        NOW,
        [_p("x", 20, 1.0, exclusive=True)],
        [ForecastNode("n", node, running)],
        {"r0": NOW + 400, "r1": NOW + 200},
        {"x": 60.0},
    )
    assert got["x"].start_s == NOW + 200  # GPU 1 empties first, though 95 GiB is free now


def test_a_dependency_starts_after_its_predicted_end_and_a_back_off_is_kept() -> None:
    node = ForecastNode("n", ONE_GPU, ())
    pending = [
        _p("child", 10, 1.0, after=("parent",)),  # ahead of its parent in the order
        _p("parent", 10, 2.0),
        _p("retry", 10, 3.0, not_before_s=NOW + 45),
    ]
    states = {"parent": JobState.queued}
    got = forecast(
        NOW, pending, [node], {}, {"child": 10, "parent": 120, "retry": 5}, dependencies=states
    )
    assert got["parent"].start_s == NOW
    assert got["child"].start_s == NOW + 120
    assert got["retry"].start_s == NOW + 45
    failed = forecast(
        NOW,
        [_p("child", 10, 1.0, after=("gone",))],
        [node],
        {},
        {"child": 10},
        dependencies={"gone": JobState.failed},
    )["child"]
    assert failed.start_s is None and failed.reason == "dependency: gone failed"


def test_a_job_no_node_fits_is_not_predicted_and_says_why() -> None:
    got = forecast(NOW, [_p("big", 120, 1.0)], [ForecastNode("n", ONE_GPU, ())], {}, {"big": 1})
    assert got["big"].start_s is None and got["big"].end_s is None
    assert got["big"].reason == (
        "resources: needs 120.0 GiB of device memory, the largest GPU has 100.0 GiB"
    )


def test_a_running_job_without_a_predicted_end_holds_its_room() -> None:
    node = ForecastNode("n", ONE_GPU, (_r("r1", 60),))
    got = forecast(NOW, [_p("a", 50, 1.0), _p("b", 20, 2.0)], [node], {"r1": None}, {"a": 1})
    assert got["a"].start_s is None and "without a predicted end" in got["a"].reason
    assert got["b"].start_s == NOW and got["b"].end_s is None  # its own step time unknown


def test_a_gang_starts_when_two_gpus_have_room_together() -> None:
    node = NodeState((Gpu(0, 100 * GIB), Gpu(1, 100 * GIB)), 1024 * GIB)
    running = (_r("r0", 90, gpu=0), _r("r1", 90, gpu=1))
    got = forecast(
        NOW,
        [_p("g", 50, 1.0, gpus=2)],
        [ForecastNode("n", node, running)],
        {"r0": NOW + 50, "r1": NOW + 70},
        {"g": 10},
    )
    assert got["g"].start_s == NOW + 70


def test_a_quota_full_until_a_running_job_ends_delays_the_start() -> None:
    mine = RunningJob("r1", "ana", 0, 0, 10 * GIB, 8 * GIB, 0.0)
    config = PolicyConfig(quotas={"ana": Quota(max_jobs=1)})
    node = ForecastNode("n", ONE_GPU, (mine,))
    got = forecast(NOW, [_p("a", 10, 1.0)], [node], {"r1": NOW + 100}, {"a": 10}, config=config)
    assert got["a"].start_s == NOW + 100  # room now, but ana may run one job at a time


def test_a_higher_class_job_starts_once_its_victims_have_left() -> None:
    low = RunningJob("low", "ben", -10, 0, 90 * GIB, 8 * GIB, 0.0)
    urgent = PendingJob("u", "ana", 10, 1.0, 50 * GIB, 8 * GIB)
    node = ForecastNode("n", ONE_GPU, (low,))
    got = forecast(NOW, [urgent], [node], {"low": NOW + 3600}, {"u": 60}, stop_s=30)
    assert (got["u"].start_s, got["u"].end_s) == (NOW + 30, NOW + 90)


def test_a_victim_leaves_after_its_step_in_flight() -> None:
    """A victim stops at its step's end: a 600 s step (a long sequence's) is half done on
    average when the SIGTERM lands, so the urgent job starts 300 s and stop_s later."""
    low = RunningJob("low", "ben", -10, 0, 90 * GIB, 8 * GIB, 0.0)
    urgent = PendingJob("u", "ana", 10, 1.0, 50 * GIB, 8 * GIB)
    node = ForecastNode("n", ONE_GPU, (low,))
    args = (NOW, [urgent], [node], {"low": NOW + 3600}, {"u": 60})
    got = forecast(*args, stop_s=30, step_s={"low": 600.0})
    assert (got["u"].start_s, got["u"].end_s) == (NOW + 330, NOW + 390)
    assert forecast(*args, stop_s=30, step_s={"low": None})["u"].start_s == NOW + 30


def test_ranged_jobs_shrink_in_the_replay_as_the_policy_shrinks_them() -> None:
    """r runs at the top of its 10-100 GiB range with no predicted end. u (class 10, 60 GiB)
    makes room by shrinking it to 30: u starts once r has stopped (stop_s), and s, ranged,
    starts beside them at its min, the room left. t (15 GiB, backing off until +100 s)
    shrinks r again, to 10, and starts 30 s after its back-off. Were r's shrinks not
    replayed, none of them would start before r's end, which is unknown."""
    curve = {10: 1000.0, 30: 1600.0, 100: 2000.0}
    points = tuple(BudgetPoint(g * GIB, 8 * GIB, t) for g, t in curve.items())
    r = RunningJob("r", "ben", 0, 0, 100 * GIB, 8 * GIB, 0.0, points=points)
    u = PendingJob("u", "ana", 10, 1.0, 60 * GIB, 8 * GIB)
    s = PendingJob("s", "ana", 0, 2.0, 10 * GIB, 8 * GIB, points=points)
    t = PendingJob("t", "ana", 0, 3.0, 15 * GIB, 8 * GIB, not_before_s=NOW + 100)
    got = forecast(
        NOW, [u, s, t], [ForecastNode("n", ONE_GPU, (r,))], {"r": None},
        {"u": 600.0, "s": 500.0, "t": 100.0}, stop_s=30.0,
    )  # fmt: skip
    assert [got[j].start_s for j in "ust"] == [NOW + 30, NOW + 30, NOW + 130]
    # with r's 100 s steps it leaves each point after the step in flight too: 50 s more
    slow = forecast(
        NOW, [u, s, t], [ForecastNode("n", ONE_GPU, (r,))], {"r": None},
        {"u": 600.0, "s": 500.0, "t": 100.0}, stop_s=30.0, step_s={"r": 100.0},
    )  # fmt: skip
    assert [slow[j].start_s for j in "ust"] == [NOW + 80, NOW + 80, NOW + 180]
