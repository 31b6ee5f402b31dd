"""When a worker that reports nothing is hung: its no-progress window, and the words a hung
job's event and error carry.

A worker reports every step (at most every 0.2 s), every evaluation and every checkpoint;
a worker silent past its window is frozen (SIGSTOP), deadlocked or wedged in a driver, and
the agent SIGKILLs it (agent/supervisor.py's watch_hang: a frozen process cannot
checkpoint) and retries the job per its `max_retries`. The window is

    max(step_factor x the last step's wall time, floor_s)   once it reported a step,
    max(startup_s, floor_s)                                 before its first step report:

loading the model and the data index, resuming a checkpoint and the first step's compile
report nothing for minutes on a large model. Checkpoint writes and evaluations report only
when they end, so floor_s must cover the longest of them.

    window = HangWindow(20, 600, 1800)    # AgentSettings.hang_window()
    window.window_s(step_s=None)          # 1800.0: no step reported yet
    window.window_s(step_s=45.0)          # 900.0: 20 x 45 s
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HangWindow:
    """How long a worker may report nothing (AgentSettings.hang_step_factor, hang_floor_s,
    hang_startup_s)."""

    step_factor: float = 20.0
    floor_s: float = 600.0
    startup_s: float = 1800.0

    def window_s(self, step_s: float | None) -> float:
        """The no-progress window of a worker whose last reported step took `step_s`
        (None: it has reported no step yet; the floor holds then too)."""
        if step_s is None:
            return max(self.startup_s, self.floor_s)
        return max(self.step_factor * step_s, self.floor_s)

    def describe(self, silent_s: float, step_s: float | None) -> str:
        """A hung worker's cause, as its job's event and error say it: how long it made no
        progress, the window, and the setting that widens it."""
        window_s = self.window_s(step_s)
        if step_s is None:
            rule = f"startup window {window_s:.0f} s, before its first step"
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
