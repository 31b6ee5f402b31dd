"""bench/api_load.py end to end, short: a private Redis, the real API, jobs seeded through
it, clients mixing list/get/submit on a fixed timetable for a bounded time. Asserts what
must hold at any speed (every request answered with its success code, the mix all there);
the latency figure itself lives in bench/RESULTS.md, measured with the full command.

    pytest -m slow tests/bench/test_api_load.py
"""

from __future__ import annotations

import pytest

from bench.api_load import run

pytestmark = pytest.mark.slow


def test_the_load_bench_runs_clean_on_loopback() -> None:
    row = run(jobs=60, clients=4, seconds=3, rate=40)
    assert row["errors"] == 0, row["error_samples"]
    assert row["jobs_in_store"] == 60 and row["requests"] >= 60
    assert all(k["count"] > 0 for k in row["by_kind"].values()), row["by_kind"]
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
