"""The start forecast's error in bench/queue_sim.py, on a short day (20 jobs an owner,
under a second): every started job got a prediction, and the figures are in the row.

    pytest tests/bench/test_queue_sim.py
"""

from __future__ import annotations

from bench.queue_sim import simulate


def test_each_started_job_has_a_forecast_and_the_error_is_reported() -> None:
    rows = simulate(20261125, 20, predict=True)
    summary = rows[0]
    started = [r for r in rows if r["row"].startswith("job:") and r["first_start_s"] is not None]
    assert summary["forecast_jobs"] + summary["forecast_none"] == len(started)
    assert summary["forecast_none"] == 0
    assert 0 <= summary["start_median_err"] <= summary["start_p90_err"]
    # a job that started the moment it was submitted was forecast to start then
    now = [r for r in started if r["first_start_s"] == r["submit_s"]]
    assert now and all(r["predicted_start_s"] == r["submit_s"] for r in now)
