"""bench/queue_ranges.py: each packable size class gets a range from 12 GiB to what it asked,
its speed the planner's relative to the asked budget; a small day with ranges keeps every
quota and every wait reason true, as the fixed day does, and reports no share error where no
window backlogs every owner."""

from __future__ import annotations

from bench.queue_ranges import MIN_DEVICE_GIB, compare, points_for, pooled_day
from bench.queue_trace import OWNERS, QUOTAS, make_trace
from wstrain.contracts.calibration import GIB
from wstrain.policy import PolicyConfig


def test_a_range_runs_from_the_min_to_what_the_job_asked() -> None:
    trace = make_trace(7, jobs_per_owner=20)
    for job in trace:
        points = points_for(job)
        if job.exclusive or job.device_bytes // GIB in (12, 141):
            assert points == ()
            continue
        sizes = [p.device_bytes for p in points]
        assert sizes == sorted(sizes) and sizes[0] == MIN_DEVICE_GIB * GIB
        assert sizes[-1] == job.device_bytes and points[-1].tokens_per_s == 1.0
        assert all(0.5 < p.tokens_per_s <= 1.0 for p in points)  # the planner's: flat-ish
        assert {p.host_bytes for p in points} == {job.host_bytes}


def test_a_ranged_day_keeps_quotas_and_true_reasons() -> None:
    row = compare(7, jobs_per_owner=20)
    assert row["ranged_jobs"] > 0
    assert row["quotas_kept"]
    assert row["fixed"]["violations"] == row["ranged"]["violations"] == 0
    assert row["ranged"]["succeeded"] == row["fixed"]["succeeded"]
    # a day this small never backlogs every owner at once: no share error to report, not 100%
    for day in (row["fixed"], row["ranged"]):
        if day["backlogged_window_h"] == 0:
            assert day["share_err"] is None and day["share_err_by_owner"] == {}
        else:
            assert 0 <= day["share_err"] < 1


def test_pooled_days_weigh_each_day_by_its_size() -> None:
    """Two days whose windows favour opposite owners: pooled, each owner's hours over all
    owners' against a quarter, so a long fair day outweighs a short unfair one; jobs an hour
    over the summed times, the wait over every started job."""
    config = PolicyConfig(quotas=QUOTAS)
    even = dict.fromkeys(OWNERS, 10.0)  # 40 GPU-h, a quarter each
    skewed = {**dict.fromkeys(OWNERS, 1.0), OWNERS[0]: 5.0}  # 8 GPU-h, the first owner 62.5%
    days = [
        {"window_gpu_h_by_owner": even, "succeeded": 30, "makespan_h": 10.0},
        {"window_gpu_h_by_owner": skewed, "succeeded": 10, "makespan_h": 30.0},
    ]
    for d, (started, wait_h) in zip(days, ((30, 1.0), (10, 5.0)), strict=True):
        d.update(started=started, wait_mean_h=wait_h)
    out = pooled_day([{"ranged": d} for d in days], "ranged", config)
    assert out["window_gpu_h"] == 48.0
    assert out["share_err_by_owner"][OWNERS[0]] == round(15 / 48 * 4 - 1, 4)  # +25%
    assert out["share_err"] == 0.25
    assert out["jobs_per_hour"] == 1.0  # 40 jobs in 40 h, not the days' mean of 1.67
    assert out["wait_mean_h"] == 2.0  # (30 x 1 + 10 x 5) / 40
    assert pooled_day([{"ranged": days[0]}], "ranged", config)["share_err"] == 0.0
