"""bench/queue_window.py: the backlogged window taken apart. The policy charges the unit
share_err counts (its usage equals the window's weights decayed alike, on both days), the
window's shares are the ones share_err is taken from, and the counterfactual that charges
only inside the window does change what the policy charged."""

from __future__ import annotations

import pytest

from bench.queue_window import window_row


@pytest.mark.parametrize("ranged", [False, True])
def test_the_policy_charges_what_share_err_counts(ranged: bool) -> None:
    row = window_row(3, jobs_per_owner=40, ranged=ranged)
    assert row["charged_equals_measured"]
    assert row["window_opens_h"] is not None and row["backlogged_window_h"] > 0
    assert sum(row["share_in_window"].values()) == pytest.approx(1.0, abs=0.005)
    for owner, share in row["share_in_window"].items():  # 4 owners of equal shares
        assert 4 * share - 1 == pytest.approx(row["share_err_by_owner"][owner], abs=0.005)
    assert 0.0 <= row["exclusive_part_of_window"] <= 1.0
    assert 0.0 <= row["started_before_part_of_window"] <= 1.0


def test_charging_only_inside_the_window_departs_from_what_was_held() -> None:
    row = window_row(3, jobs_per_owner=40, ranged=True, charge_window_only=True)
    assert row["gpu_h_before_window"] > 0  # something ran outside the window: not charged
    assert not row["charged_equals_measured"]
