"""What a worker that ran out of a memory budget tells its agent: which budget, what it had
and asked for, and the smallest budget that would have held it (`WorkerMessage.needs_gib`,
exit `WorkerExit.out_of_memory`). The agent fails the job with that figure rather than
retrying a plan that would run out again.

Three ways to run out:

- the device: CUDA's allocator, capped at the device budget by
  `set_per_process_memory_fraction`, raises OutOfMemoryError. What would have held it: the
  most the allocator reserved so far plus the allocation it was refused (CUDA's message
  says "Tried to allocate 2.00 GiB").
- the host: the working set's host arena refuses a tile past its limit (BudgetExceeded,
  with the arena's bytes, the tile's and the limit). What would have held it: the budget
  plus the shortfall; the arena allocates its tiles in turn, so later ones may need more,
  which is why the figure is "at least".
- the disk: the spill file of a plan's spilled layers (working_set/spill.py) past the disk
  budget, refused before it is allocated. What would have held it: the file's size.

Figures are rounded up to half a GiB, the step a user writes budgets in.
"""

from __future__ import annotations

import math
import re
from typing import cast

import torch

from wstrain.contracts.budget import Budget
from wstrain.contracts.calibration import GIB
from wstrain.contracts.errors import BudgetExceeded

_TRIED = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _half_gib_up(n_bytes: float) -> float:
    return math.ceil(n_bytes / GIB * 2) / 2


def refused_bytes(cuda_message: str) -> int:
    """The allocation CUDA's out-of-memory message names, 0 when it names none."""
    m = _TRIED.search(cuda_message)
    return int(float(m.group(1)) * _UNIT[m.group(2)]) if m else 0


def device_needs(
    cuda_message: str, reserved_peak_bytes: int, budget_gib: float
) -> tuple[str, dict[str, float]]:
    """The error text and needs_gib of a device out of memory."""
    asked = refused_bytes(cuda_message)
    needs = max(_half_gib_up(reserved_peak_bytes + asked), budget_gib + 0.5)
    held_gib = reserved_peak_bytes / GIB
    text = (
        f"ran out of its device budget of {budget_gib:g} GiB: it held {held_gib:.2f} GiB and "
        f"asked for {asked / GIB:.2f} GiB more; a device budget of at least "
        f"{needs:g} GiB fits this plan: raise budget.device_gib to {needs:g}, or resume with "
        "a smaller overrides.window or micro_batch"
    )
    return text, {"device_gib": needs}


def host_needs(exc: BudgetExceeded, budget_gib: float) -> tuple[str, dict[str, float]]:
    """The error text and needs_gib of a host arena that refused a tile."""
    d = exc.detail
    shortfall = (
        cast(int, d["arena_bytes"]) + cast(int, d["tile_bytes"]) - cast(int, d["limit_bytes"])
    )
    needs = max(_half_gib_up(budget_gib * GIB + shortfall), budget_gib + 0.5)
    text = (
        f"ran out of its host budget of {budget_gib:g} GiB: {exc.message} A host budget of "
        f"at least {needs:g} GiB fits this tile: raise budget.host_gib to {needs:g}"
    )
    return text, {"host_gib": needs}


def disk_needs(exc: BudgetExceeded, budget_gib: float) -> tuple[str, dict[str, float]]:
    """The error text and needs_gib of a spill file past the disk budget."""
    # the file's size is known exactly (it was refused whole), and exceeds the budget
    needs = _half_gib_up(cast(int, exc.detail["disk_bytes"]))
    text = (
        f"ran out of its disk budget of {budget_gib:g} GiB: {exc.message}. A disk budget of "
        f"at least {needs:g} GiB fits this spill: raise budget.disk_gib to {needs:g}"
    )
    return text, {"disk_gib": needs}


def budget_exit(
    exc: torch.cuda.OutOfMemoryError | BudgetExceeded, budget: Budget
) -> tuple[str, dict[str, float]]:
    """The error text and needs_gib of either way to run out of the fixed `budget`."""
    if isinstance(exc, BudgetExceeded) and "disk_bytes" in exc.detail:
        return disk_needs(exc, budget.disk_gib)
    if isinstance(exc, BudgetExceeded):
        return host_needs(exc, budget.host_gib)
    return device_needs(str(exc), torch.cuda.max_memory_reserved(), budget.device_gib)
