"""bench/shrink.py on the CPU: a ranged job stopped at its first checkpoint by SIGTERM (as
the agent stops a job it shrinks) and restarted under the plan of the lower point of its
range ends with the weights of the same job run at that point from start to end (fp32,
1e-5), three real worker processes; with a second job arriving, the queue's policy makes the
shrink and both jobs run at once.

    pytest tests/bench/test_shrink.py
"""

from __future__ import annotations

import argparse

from bench.shrink import run


def _cpu_args(no_straight: bool, second_layers: int = 0) -> argparse.Namespace:
    return argparse.Namespace(
        layers=0, seq=32, global_batch=4, steps=6, checkpoint_every=2, high_gib=2.0,
        low_gib=1.0, host_gib=2.0, device="cpu", no_straight=no_straight,
        second_layers=second_layers, gpu_gib=2.5, second_host_gib=2.0,
    )  # fmt: skip


def test_a_job_shrunk_for_a_second_job_ends_with_the_straight_runs_weights() -> None:
    # a 2.5 GiB "GPU": the job at its 2 GiB max leaves 0.5, under the newcomer's 1 GiB min,
    # so the policy shrinks the job to its min (not None: no preemption); then both run
    row = run(_cpu_args(no_straight=False, second_layers=2))
    assert row["policy_shrink"].startswith("2 -> 1 GiB, freeing 1 GiB"), row["policy_shrink"]
    assert row["second_steps"] >= 6 and row["second_final_loss"] > 0
    assert 2 <= row["shrunk_at_step"] < 6  # stopped mid-run, resumed at the low point
    # the GPU it then shares moves none of its math
    assert row["weights_rel_err_max"] < 1e-5
    assert abs(row["final_loss"] - row["straight_final_loss"]) < 1e-5 * row["straight_final_loss"]
    # each part's stalls a step beside the planner's breakdown, for a row that misses its
    # prediction to say where (the high part's 3 CPU steps of milliseconds are reported
    # once: the worker reports at most every 0.2 s)
    for part in ("low", "straight_low"):
        assert set(row[f"stalls_s_{part}"]) >= {"optimizer", "weights"}, row[f"stalls_s_{part}"]
        assert all(s >= 0 for s in row[f"stalls_s_{part}"].values())
        assert row[f"predicted_{part}"]["step_seconds"] > 0


def test_no_straight_runs_the_two_parts_only() -> None:
    row = run(_cpu_args(no_straight=True))
    assert row["weights_rel_err_max"] is None and row["straight_final_loss"] is None
    assert "tokens_per_s_straight_low" not in row
    assert row["shrunk_at_step"] >= 2 and row["predicted_low"]["step_seconds"] > 0
