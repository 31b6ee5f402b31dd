"""Budgets inside ranges (policy/budgets.py): mins first, the rest where it buys the most
weighted tokens/s, nothing spent where speed does not grow; shrinking frees what is asked at
the least loss, or says it cannot."""

from __future__ import annotations

import itertools

import pytest

from wstrain.contracts.calibration import GIB
from wstrain.policy.budgets import (
    BudgetPoint,
    RangedJob,
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
