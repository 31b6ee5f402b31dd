"""bench/window_buffer.py on the rows measured on H200s: without the grown write
buffer it reproduces each row's planned recomputation; with it, never more, and less only
where a window's forward leaves the link idle.

    pytest tests/bench/test_window_buffer.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.window_buffer import window_costs
from wstrain.planning import layer_time

RESULTS = Path(__file__).parents[2] / "bench/results"
ROWS = {
    (f, r["name"]): r
    for f in (
        "runtime/working-set-rows-h200-2026-11-27.json",
        "runtime/working-set-40gib-and-pinned-overlap-h200-2026-11-27.json",
    )
    for r in json.loads((RESULTS / f).read_text())
}


@pytest.mark.parametrize(
    ("results", "name", "window"),
    [
        ("runtime/working-set-rows-h200-2026-11-27.json", "ws-20", 3),
        ("runtime/working-set-rows-h200-2026-11-27.json", "ws-12", 0),
        ("runtime/working-set-rows-h200-2026-11-27.json", "ws-20-round-fp8", 3),
        ("runtime/working-set-40gib-and-pinned-overlap-h200-2026-11-27.json", "ws-40", 11),
    ],
)
def test_the_plain_dp_is_the_rows_plan_and_the_grown_buffer_never_costs_more(
    results: str, name: str, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the rows were planned while attention cost 3.5 / 3 of its profiled time
    # (contracts/calibration.py ATTENTION_BACKWARD_RATIO): costed so again
    monkeypatch.setattr(layer_time, "ATTENTION_OVERHEAD", 3.5 / 3)
    row = ROWS[results, name]
    rounds = row["global_batch"] // row["plan"]["micro_batch"]
    costs = window_costs(row)
    best_w, best_s, _ = min(costs, key=lambda c: c[1])
    assert best_w == window == row["plan"]["window"]
    assert best_s * rounds == pytest.approx(row["plan"]["predicted"]["recompute_seconds"], rel=1e-6)
    assert all(grown <= plain + 1e-12 for _, plain, grown in costs)
    grown_best = min(c[2] for c in costs)
    if window == 0:  # no window layers: the link never idles in the forward
        assert grown_best == pytest.approx(best_s)
    else:
        assert grown_best < best_s
