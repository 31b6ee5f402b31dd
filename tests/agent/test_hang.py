"""agent/hang.py and the hang settings: a worker's no-progress window is its startup window
and its plan's predicted step before its first step report, then max(factor x its last step,
floor); the cause names how long it was silent, the window and the setting that widens it;
the settings are bounded.
agent/scheduling.py's preemptor_text: a victim's owner reads another owner's job by priority,
never by id. A real frozen worker: tests/e2e/test_hang.py.

    pytest tests/agent/test_hang.py
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from wstrain.agent.hang import HangWindow
from wstrain.agent.scheduling import preemptor_text
from wstrain.agent.settings import AgentSettings
from wstrain.store.scheduling import PendingRow


def test_the_window_is_startup_before_a_step_then_the_larger_of_factor_and_floor() -> None:
    w = HangWindow(step_factor=20, floor_s=600, startup_s=1800)
    assert w.window_s(None) == 1800  # model load and the first compile report nothing
    assert w.window_s(0.5) == 600  # 20 x 0.5 s = 10 s: the floor covers a checkpoint write
    assert w.window_s(45.0) == 900  # 20 x 45 s past the floor
    assert HangWindow(20, 600, 60).window_s(None) == 600  # the floor holds before a step too


def test_the_first_step_runs_inside_the_startup_window_at_its_predicted_time() -> None:
    w = HangWindow(step_factor=20, floor_s=600, startup_s=1800)
    long = w.for_plan(2543.0)  # a million tokens over 32 layers at 240 GiB of host
    assert long.window_s(None) == 1800 + 20 * 2543
    assert long.window_s(45.0) == 900  # once a step is reported, the plan no longer counts
    assert w.for_plan(0.004).window_s(None) == pytest.approx(1800.08)
    assert w.for_plan(float("nan")).window_s(None) == 1800
    assert w.for_plan(float("inf")).window_s(None) == 1800 + 20 * 86400
    cause = long.describe(60000.0, None)
    assert "(startup window 52660 s: 1800 s and 20 x its predicted step 2543 s, before" in cause


def test_the_cause_says_how_long_the_window_and_the_fix() -> None:
    w = HangWindow(step_factor=20, floor_s=600, startup_s=1800)
    after = w.describe(912.4, 45.0)
    assert after.startswith("hung: no progress reported for 912 s (window 900 s: 20 x its last")
    assert "at least 600 s" in after and "SIGKILL, no checkpoint" in after
    assert "WSTRAIN_HANG_FLOOR_S or WSTRAIN_HANG_STEP_FACTOR" in after
    before = w.describe(1801.0, None)
    assert "(startup window 1800 s, before its first step)" in before
    assert before.endswith("needs a larger WSTRAIN_HANG_STARTUP_S")


def test_the_settings_build_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WSTRAIN_HANG_STEP_FACTOR", "5")
    monkeypatch.setenv("WSTRAIN_HANG_FLOOR_S", "30")
    monkeypatch.setenv("WSTRAIN_HANG_STARTUP_S", "90")
    assert AgentSettings().hang_window() == HangWindow(5, 30, 90)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("WSTRAIN_HANG_STEP_FACTOR", "1"),  # a step slower than the last would be a hang
        ("WSTRAIN_HANG_FLOOR_S", "0"),
        ("WSTRAIN_HANG_STARTUP_S", "86401"),
    ],
)
def test_a_window_setting_out_of_bounds_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("WSTRAIN_").lower()):
        AgentSettings()


def _row(job_id: str, owner: str, priority: int) -> PendingRow:
    return PendingRow(job_id, owner, priority, 0.0, 1 << 30, 1 << 30, False, (), 0.0)


def test_a_victim_reads_its_own_preemptor_by_id_and_another_owners_by_priority_only() -> None:
    assert preemptor_text("ana", _row("j-ana-2", "ana", 10)) == "job j-ana-2"
    other = preemptor_text("ana", _row("j-ben-1", "ben", 10))
    assert other == "another owner's job of priority 10" and "j-ben-1" not in other
    assert preemptor_text("ana", None) == "a higher-priority job"
