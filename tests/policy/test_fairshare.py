"""Fair share with decay (policy/fairshare.py): the decay against a hand
computation, the charge of running jobs by the share of their GPU, Slurm's classic factor
and the order of pending jobs.

    pytest tests/policy/test_fairshare.py
"""

from __future__ import annotations

import math

import pytest

from wstrain.contracts.calibration import GIB
from wstrain.policy import (
    Gpu,
    NodeState,
    PendingJob,
    PolicyConfig,
    RunningJob,
    Usage,
    charge,
    decide,
    fair_share_factors,
)

DAY_S = 86400.0
WEEK_S = 7 * DAY_S
NODE = NodeState((Gpu(0, 141 * GIB), Gpu(1, 141 * GIB)), 1024 * GIB)


def test_usage_halves_every_half_life() -> None:
    u = Usage(1000.0, 0.0)
    assert u.decayed(WEEK_S).gpu_s == pytest.approx(500.0)
    assert u.decayed(2 * WEEK_S).gpu_s == pytest.approx(250.0)
    assert u.decayed(WEEK_S / 2).gpu_s == pytest.approx(1000.0 / math.sqrt(2))
    assert u.decayed(DAY_S, half_life_s=DAY_S).gpu_s == pytest.approx(500.0)


def test_usage_add_matches_a_hand_computation() -> None:
    # 3600 GPU-s at t=0, 1800 more a day later: 3600 · 2^(-1/7) + 1800
    # 2^(-1/7) = 0.905723664263, so 3260.605 + 1800 = 5060.605 GPU-s
    u = Usage().add(0.0, 3600.0).add(DAY_S, 1800.0)
    assert u.gpu_s == pytest.approx(5060.605, abs=1e-3)
    assert u.at_s == DAY_S
    # a week after that it is half of that
    assert u.decayed(DAY_S + WEEK_S).gpu_s == pytest.approx(2530.30, abs=1e-2)


def test_a_clock_that_goes_back_decays_nothing() -> None:
    u = Usage(100.0, 50.0)
    assert u.decayed(10.0) == u
    assert u.add(10.0, 5.0).gpu_s == pytest.approx(105.0)


def _running(
    jid: str, owner: str, dev_gib: float, started_s: float, exclusive: bool = False
) -> RunningJob:
    return RunningJob(jid, owner, 0, 0, int(dev_gib * GIB), 8 * GIB, started_s, exclusive)


def test_charge_weights_gpu_seconds_by_the_share_of_the_gpu_reserved() -> None:
    running = [
        _running("a1", "ana", 20, 0.0),  # an hour at 20/141 of the GPU
        _running("b1", "ben", 12, 0.0, exclusive=True),  # exclusive: the whole GPU
        _running("b2", "ben", 141, 1800.0),  # started half-way: half an hour at 1.0
    ]
    usage = charge({}, running, NODE, since_s=0.0, now_s=3600.0)
    assert usage["ana"].gpu_s == pytest.approx(3600 * 20 / 141)
    assert usage["ben"].gpu_s == pytest.approx(3600 + 1800)
    # a second charge adds only the new interval, on top of the decayed old usage
    again = charge(usage, running, NODE, since_s=3600.0, now_s=7200.0)
    assert again["ana"].gpu_s == pytest.approx(
        3600 * 20 / 141 * 2 ** (-3600 / WEEK_S) + 3600 * 20 / 141
    )


def test_charge_on_a_cpu_node_weights_by_host_memory() -> None:
    cpu = NodeState((), 64 * GIB)
    job = RunningJob("c1", "chen", 0, None, 8 * GIB, 8 * GIB, 0.0)
    assert charge({}, [job], cpu, 0.0, 100.0)["chen"].gpu_s == pytest.approx(25.0)


def test_slurm_factor_two_owners() -> None:
    usage = {"ana": Usage(3.0, 0.0), "ben": Usage(1.0, 0.0)}
    f = fair_share_factors(usage, ["ana", "ben"], PolicyConfig(), 0.0)
    # F = 2^(-(U_o/U)/(S_o/S)): ana 2^(-0.75/0.5), ben 2^(-0.25/0.5)
    assert f["ana"] == pytest.approx(2**-1.5)
    assert f["ben"] == pytest.approx(2**-0.5)


def test_slurm_factor_is_one_without_usage_and_half_at_the_share() -> None:
    assert fair_share_factors({}, ["ana", "ben"], PolicyConfig(), 0.0) == {"ana": 1.0, "ben": 1.0}
    usage = {"ana": Usage(5.0, 0.0), "ben": Usage(5.0, 0.0)}
    f = fair_share_factors(usage, ["ana", "ben", "chen"], PolicyConfig(), 0.0)
    # each of ana and ben used 1/2 against a share of 1/3: 2^(-1.5); chen used nothing
    assert f == pytest.approx({"ana": 2**-1.5, "ben": 2**-1.5, "chen": 1.0})


def test_slurm_factor_follows_configured_shares() -> None:
    config = PolicyConfig(shares={"ana": 3.0, "ben": 1.0})
    usage = {"ana": Usage(3.0, 0.0), "ben": Usage(1.0, 0.0)}
    f = fair_share_factors(usage, ["ana", "ben"], config, 0.0)
    assert f["ana"] == pytest.approx(0.5) and f["ben"] == pytest.approx(0.5)


def _pending(jid: str, owner: str, priority: int, submitted_s: float) -> PendingJob:
    return PendingJob(jid, owner, priority, submitted_s, 200 * GIB, 8 * GIB)  # never fits


def test_order_is_class_then_factor_then_submission() -> None:
    usage = {"ana": Usage(10.0, 0.0), "ben": Usage(1.0, 0.0)}
    pending = [
        _pending("a-old", "ana", 0, 1.0),
        _pending("b-new", "ben", 0, 5.0),
        _pending("b-old", "ben", 0, 2.0),
        _pending("a-urgent", "ana", 10, 9.0),
        _pending("b-low", "ben", -10, 0.0),
    ]
    d = decide(10.0, pending, [], NODE, usage)
    assert d.order == ("a-urgent", "b-old", "b-new", "a-old", "b-low")
    assert d.factors["ben"] > d.factors["ana"]
