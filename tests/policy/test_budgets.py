"""Budgets inside ranges (policy/budgets.py): mins first, the rest where it buys the most
weighted tokens/s, nothing spent where speed does not grow; shrinking frees what is asked at
the least loss, or says it cannot; a decision round (policy/decide.py) starts ranged jobs at
their min and gives them what their GPU has left; after running out of memory, what is
left of a range is its points at or above the measured floor."""

from __future__ import annotations

import itertools

import pytest

from wstrain.contracts.calibration import GIB
from wstrain.policy import Gpu, NodeState, PendingJob, PolicyConfig, Quota, RunningJob, decide
from wstrain.policy.budgets import (
    BudgetPoint,
    RangedJob,
    above_floor,
    budget_reason,
    choose_points,
    shrink_to_free,
)

HOST = 64 * GIB


def _job(jid: str, curve: dict[int, float], weight: float = 1.0, host_gib: int = 8) -> RangedJob:
    """A job whose tokens/s at each device GiB is `curve`; host fixed."""
    return RangedJob(
        jid, weight, tuple(BudgetPoint(g * GIB, host_gib * GIB, t) for g, t in curve.items())
    )


CONCAVE = {10: 1000.0, 20: 1600.0, 30: 1900.0, 40: 2000.0}
FLAT = {10: 1000.0, 20: 1000.0, 40: 1000.0}


def _gib(points: dict[str, BudgetPoint]) -> dict[str, int]:
    return {k: p.device_bytes // GIB for k, p in points.items()}


def test_mins_that_do_not_fit_are_refused() -> None:
    assert choose_points([_job("a", CONCAVE), _job("b", CONCAVE)], 15 * GIB, HOST) is None
    assert choose_points([_job("a", CONCAVE, host_gib=80)], 40 * GIB, HOST) is None


def test_memory_goes_where_it_buys_the_most() -> None:
    got = choose_points([_job("a", CONCAVE), _job("b", FLAT)], 60 * GIB, HOST)
    assert got is not None
    assert _gib(got) == {"a": 40, "b": 10}  # b gains nothing from memory: it keeps its min


def test_a_speed_equal_but_for_float_rounding_buys_no_memory() -> None:
    """The same plan at two points is predicted equal up to rounding: the job keeps its min
    (a real gain, however small, still buys the point)."""
    rounding = {10: 1000.0, 20: 1000.0 * (1 + 1e-13)}
    got = choose_points([_job("a", rounding)], 40 * GIB, HOST)
    assert got is not None and _gib(got) == {"a": 10}
    small = {10: 1000.0, 20: 1000.0 * (1 + 1e-6)}
    got = choose_points([_job("a", small)], 40 * GIB, HOST)
    assert got is not None and _gib(got) == {"a": 20}


def test_the_choice_is_the_best_split_of_a_concave_curve() -> None:
    """Against every combination of points that fits: greedy is exact on concave curves."""
    jobs = [_job("a", CONCAVE), _job("b", CONCAVE, weight=2.0), _job("c", CONCAVE, weight=0.5)]
    for free_gib in (30, 45, 60, 75, 90, 120):
        got = choose_points(jobs, free_gib * GIB, HOST)
        assert got is not None
        value = sum(j.weight * got[j.id].tokens_per_s for j in jobs)
        best = max(
            sum(j.weight * p.tokens_per_s for j, p in zip(jobs, combo, strict=True))
            for combo in itertools.product(*(j.points for j in jobs))
            if sum(p.device_bytes for p in combo) <= free_gib * GIB
        )
        assert value == pytest.approx(best), free_gib
        assert sum(p.device_bytes for p in got.values()) <= free_gib * GIB


def test_a_heavier_owner_gets_the_upgrade_first() -> None:
    got = choose_points([_job("light", CONCAVE), _job("heavy", CONCAVE, 3.0)], 30 * GIB, HOST)
    assert got is not None and _gib(got) == {"light": 10, "heavy": 20}


def test_host_memory_bounds_an_upgrade() -> None:
    hungry = RangedJob(
        "a", 1.0, (BudgetPoint(10 * GIB, 8 * GIB, 1000.0), BudgetPoint(20 * GIB, 70 * GIB, 2000.0))
    )
    got = choose_points([hungry], 40 * GIB, HOST)
    assert got is not None and got["a"].host_bytes == 8 * GIB


def test_shrinking_frees_what_is_asked_at_the_least_loss() -> None:
    a, b = _job("a", CONCAVE), _job("b", CONCAVE, weight=3.0)
    moves = shrink_to_free([(a, 3), (b, 3)], 10 * GIB, 0)  # both at 40 GiB
    assert moves is not None
    assert [(m.job_id, m.to.device_bytes // GIB, m.freed_device_bytes // GIB) for m in moves] == [
        ("a", 30, 10)
    ]  # the light job's last 10 GiB buy 100 tokens/s; the heavy one's 300
    assert shrink_to_free([(a, 3)], 0, 0) == []


def test_shrinking_that_cannot_free_enough_says_so() -> None:
    a = _job("a", CONCAVE)
    assert shrink_to_free([(a, 3)], 31 * GIB, 0) is None  # 40 -> 10 frees 30
    moves = shrink_to_free([(a, 3)], 30 * GIB, 0)
    assert moves is not None and moves[0].to.device_bytes == 10 * GIB


def test_points_must_ascend() -> None:
    with pytest.raises(ValueError, match="ascend"):
        _job("a", {20: 1.0, 10: 2.0})
    with pytest.raises(ValueError, match="min point"):
        RangedJob("a", 1.0, ())


def test_the_reason_names_the_point_and_the_range() -> None:
    job = _job("a", CONCAVE)
    text = budget_reason(job, job.points[1])
    assert text.startswith("budget 20.0 GiB device, 8.0 GiB host of its range 10.0 GiB-40.0 GiB")
    assert "1,600 predicted tokens/s" in text


# ---- in the round: decide() places ranged jobs at their min, then spends what is left


def _pending(
    jid: str, owner: str, curve: dict[int, float], host_gib: int = 8, priority: int = 0
) -> PendingJob:
    points = tuple(BudgetPoint(g * GIB, host_gib * GIB, t) for g, t in curve.items())
    low = points[0]
    return PendingJob(jid, owner, priority, 1.0, low.device_bytes, low.host_bytes, points=points)


def _running(jid: str, gpu: int, dev_gib: int) -> RunningJob:
    return RunningJob(jid, "dan", 0, gpu, dev_gib * GIB, 8 * GIB, 0.0)


def test_a_round_starts_ranged_jobs_at_their_min_and_spends_what_the_gpu_has_left() -> None:
    node = NodeState((Gpu(0, 80 * GIB),), 256 * GIB)
    fixed = PendingJob("fixed", "cara", 0, 0.5, 10 * GIB, 8 * GIB)
    pending = [fixed, _pending("a", "ana", CONCAVE), _pending("b", "ben", FLAT)]
    d = decide(10.0, pending, [_running("r", 0, 20)], node, {})
    assert {s.job_id for s in d.start} == {"fixed", "a", "b"}
    assert _gib(dict(d.budgets)) == {"a": 40, "b": 10}  # 80 - 20 - 10 = 50 left: a's max
    assert "fixed" not in d.budgets


def test_ranged_jobs_that_only_fit_at_their_min_start_there() -> None:
    node = NodeState((Gpu(0, 40 * GIB),), 256 * GIB)
    pending = [_pending("a", "ana", CONCAVE), _pending("b", "ben", CONCAVE)]
    d = decide(10.0, pending, [_running("r", 0, 20)], node, {})
    assert _gib(dict(d.budgets)) == {"a": 10, "b": 10}


def test_a_gpu_held_for_a_waiting_job_keeps_what_is_left() -> None:
    """A class-5 ranged job starts first; a 70 GiB job that then finds no room drains the
    GPU: the ranged job keeps its min, the rest is left to the hold."""
    node = NodeState((Gpu(0, 80 * GIB),), 256 * GIB)
    ranged = _pending("s", "ana", CONCAVE, priority=5)
    big = PendingJob("big", "ben", 0, 0.5, 70 * GIB, 8 * GIB)
    d = decide(10.0, [ranged, big], [_running("r", 0, 20)], node, {})
    assert [s.job_id for s in d.start] == ["s"] and d.held == {"big": 0}
    assert _gib(dict(d.budgets)) == {"s": 10}
    d = decide(10.0, [ranged], [_running("r", 0, 20)], node, {})  # no hold: 60 GiB left
    assert _gib(dict(d.budgets)) == {"s": 40}


def test_on_a_cpu_node_device_and_host_come_out_of_one_pool() -> None:
    node = NodeState((), 60 * GIB)
    d = decide(10.0, [_pending("a", "ana", CONCAVE, host_gib=16)], [], node, {})
    # 40 + 16 = 56 of the 60 GiB pool
    assert _gib(dict(d.budgets)) == {"a": 40}
    d = decide(10.0, [_pending("a", "ana", CONCAVE, host_gib=16)], [], NodeState((), 50 * GIB), {})
    assert _gib(dict(d.budgets)) == {"a": 30}


def test_a_ranged_job_is_given_at_its_min() -> None:
    with pytest.raises(ValueError, match="first point"):
        PendingJob("a", "ana", 0, 1.0, 20 * GIB, 8 * GIB, points=_job("a", CONCAVE).points)


def test_an_upgrade_stays_within_its_owners_quota() -> None:
    node = NodeState((Gpu(0, 80 * GIB),), 256 * GIB)
    pending = [_pending("a", "ana", CONCAVE)]
    quota = {"ana": Quota.from_gib(device_gib=25)}
    d = decide(10.0, pending, [], node, {}, PolicyConfig(quotas=quota))
    assert _gib(dict(d.budgets)) == {"a": 20}  # 30 would pass ana's 25 GiB
    two = [_pending("a", "ana", CONCAVE), _pending("b", "ana", CONCAVE)]
    d = decide(10.0, two, [], node, {}, PolicyConfig(quotas=quota))
    assert sum(p.device_bytes for p in d.budgets.values()) <= 25 * GIB


# ---- shrink, do not evict: a ranged running job restarts lower in its range to make room


def _ranged_running(
    jid: str, at_gib: int, priority: int = 0, curve: dict[int, float] = CONCAVE
) -> RunningJob:
    """Dan's ranged job on GPU 0 at `at_gib` of device, started at time 0."""
    points = tuple(BudgetPoint(g * GIB, 8 * GIB, t) for g, t in curve.items())
    return RunningJob(jid, "dan", priority, 0, at_gib * GIB, 8 * GIB, 0.0, points=points)


def test_a_job_that_needs_room_shrinks_a_ranged_job_instead_of_waiting() -> None:
    node = NodeState((Gpu(0, 80 * GIB),), 256 * GIB)
    new = PendingJob("new", "ana", 0, 5.0, 50 * GIB, 8 * GIB)
    d = decide(10.0, [new], [_ranged_running("r", 40), _running("f", 0, 20)], node, {})
    # 80 - 40 - 20 = 20 free; 50 needed: r goes from 40 to 10 GiB
    assert {k: p.device_bytes // GIB for k, p in d.shrink.items()} == {"r": 10}
    assert d.preempt == () and d.held == {"new": 0}
    assert d.reasons["new"].startswith("preemption: shrinking 1 ranged job on GPU 0")


def test_shrinking_takes_the_least_and_preemption_what_shrinking_cannot_free() -> None:
    node = NodeState((Gpu(0, 80 * GIB),), 256 * GIB)
    running = [_ranged_running("r", 40), _running("f", 0, 20)]
    small = PendingJob("small", "ana", 0, 5.0, 30 * GIB, 8 * GIB)
    d = decide(10.0, [small], running, node, {})
    assert {k: p.device_bytes // GIB for k, p in d.shrink.items()} == {"r": 30}
    huge = PendingJob("huge", "ana", 5, 5.0, 75 * GIB, 8 * GIB)  # r at its min frees 30
    d = decide(10.0, [huge], running, node, {})
    assert d.shrink == {} and set(d.preempt) == {"r", "f"}


def test_a_higher_class_ranged_job_is_not_shrunk_for_a_lower_one() -> None:
    node = NodeState((Gpu(0, 80 * GIB),), 256 * GIB)
    d = decide(
        10.0,
        [PendingJob("new", "ana", 0, 5.0, 50 * GIB, 8 * GIB)],
        [_ranged_running("r", 40, priority=5), _running("f", 0, 20)],
        node,
        {},
    )
    assert d.shrink == {} and d.preempt == () and d.kinds["new"].value == "resources"


def test_after_running_out_only_points_at_or_above_the_floor_are_left() -> None:
    points = _job("a", CONCAVE).points  # 10, 20, 30, 40 GiB of device, 8 of host
    assert [p.device_bytes // GIB for p in above_floor(points, 15 * GIB, 0)] == [20, 30, 40]
    assert above_floor(points, 0, 8 * GIB) == points  # the host held: every point holds it
    assert above_floor(points, 0, 9 * GIB) == ()  # the host ran out and is fixed
    assert above_floor(points, 41 * GIB, 0) == ()  # past the max


# ---- growing back: a ranged job below its top restarts higher where no one waits


def test_a_job_below_its_top_grows_into_room_no_one_waits_for() -> None:
    node = NodeState((Gpu(0, 80 * GIB),), 256 * GIB)
    shrunk = _ranged_running("s", 10)
    late = PolicyConfig().grow_after_s  # since its start at 0
    assert _gib(dict(decide(late, [], [shrunk], node, {}).grow)) == {"s": 40}
    # not before grow_after_s since its last start: no thrash as short jobs come and go
    assert decide(late - 1, [], [shrunk], node, {}).grow == {}
    # a job waiting for memory has it first, even one the node cannot take yet
    big = PendingJob("big", "ben", 0, 0.5, 75 * GIB, 8 * GIB)
    assert decide(late, [big], [shrunk], node, {}).grow == {}
    # a point that buys under grow_min_gain (10%) is not worth a restart
    near_top = _ranged_running("n", 30)  # 1900 -> 2000 tokens/s: +5%
    assert decide(late, [], [near_top], node, {}).grow == {}
    flat = _ranged_running("f", 10, curve=FLAT)
    assert decide(late, [], [flat], node, {}).grow == {}
    # the owner's quota bounds the room it may grow into
    capped = PolicyConfig(quotas={"dan": Quota(max_device_bytes=25 * GIB)})
    assert _gib(dict(decide(late, [], [shrunk], node, {}, capped).grow)) == {"s": 20}
