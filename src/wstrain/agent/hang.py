"""When a worker that reports nothing is hung: its no-progress window, and the words a hung
job's event and error carry.

A worker reports every step (at most every 0.2 s), every evaluation and every checkpoint;
a worker silent past its window is frozen (SIGSTOP), deadlocked or wedged in a driver, and
the agent SIGKILLs it (agent/supervisor.py's watch_hang: a frozen process cannot
checkpoint) and retries the job per its `max_retries`. The window is

    max(step_factor x the last step's wall time, floor_s)   once it reported a step,
    max(startup_s, floor_s)                                 before its first step report,
      + step_factor x the plan's predicted step

loading the model and the data index, resuming a checkpoint and the first step's compile
report nothing for minutes on a large model, and the first step itself reports only when it
ends: a million tokens over 32 layers plans at ~2,500 s a step, and a first step also fills
the host's saved-activation store (4.4x the steps after it at 64K tokens with a 240 GiB host,
bench/RESULTS.md#long-context), so the step factor covers it as it covers every later step.
Checkpoint writes and evaluations report only when they end, so floor_s must cover the
longest of them.

    window = HangWindow(20, 600, 1800)    # AgentSettings.hang_window()
    window.window_s(step_s=None)          # 1800.0: no step reported yet
    window.window_s(step_s=45.0)          # 900.0: 20 x 45 s
    window.for_plan(2543.0).window_s(None)  # 52660.0: 1800 s + 20 x the predicted 2,543 s
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MAX_STEP_S = 86400.0


@dataclass(frozen=True)
class HangWindow:
    """How long a worker may report nothing (AgentSettings.hang_step_factor, hang_floor_s,
    hang_startup_s)."""

    step_factor: float = 20.0
    floor_s: float = 600.0
    startup_s: float = 1800.0
    predicted_step_s: float = 0.0  # the job's plan's step: its first runs inside startup

    def for_plan(self, predicted_step_s: float) -> HangWindow:
        """This window for a job whose plan predicts `predicted_step_s` a step."""
        # bounded as the settings are (a day): a plan's step is finite, but never trusted
        return replace(self, predicted_step_s=min(max(0.0, predicted_step_s), MAX_STEP_S))

    def window_s(self, step_s: float | None) -> float:
        """The no-progress window of a worker whose last reported step took `step_s`
        (None: it has reported no step yet; the floor holds then too)."""
        if step_s is None:
            return max(self.startup_s, self.floor_s) + self.step_factor * self.predicted_step_s
        return max(self.step_factor * step_s, self.floor_s)

    def describe(self, silent_s: float, step_s: float | None) -> str:
        """A hung worker's cause, as its job's event and error say it: how long it made no
        progress, the window, and the setting that widens it."""
        window_s = self.window_s(step_s)
        if step_s is None:
            first = (
                f": {max(self.startup_s, self.floor_s):.0f} s and {self.step_factor:g} x its "
                f"predicted step {self.predicted_step_s:.4g} s"
                if self.predicted_step_s
                else ""
            )
            rule = f"startup window {window_s:.0f} s{first}, before its first step"
            fix = "WSTRAIN_HANG_STARTUP_S"
        else:
            rule = (
                f"window {window_s:.0f} s: {self.step_factor:g} x its last step "
                f"{step_s:.3g} s, at least {self.floor_s:.0f} s"
            )
            fix = "WSTRAIN_HANG_FLOOR_S or WSTRAIN_HANG_STEP_FACTOR"
        return (
            f"hung: no progress reported for {silent_s:.0f} s ({rule}); worker killed with "
            f"SIGKILL, no checkpoint written; a job that is this slow to report needs a "
            f"larger {fix}"
        )
