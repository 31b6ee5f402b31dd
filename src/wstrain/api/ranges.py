"""Budgets as ranges at submission: the point of a ranged budget a job is planned at, and a
few points of its range planned beside it, so a user sees what memory buys (POST
/v1/plans, `wstrain plan`). Run inside the planner processes (api/plan_pool.py) by
validate_and_plan, never on the API's event loop.

    device_gib, host_gib = choose_point(spec, nodes)   # InvalidSpec naming budget.device_gib
    plan.range_points = range_points(spec, plan_at, node)

Until the scheduling policy chooses within ranges, a ranged job is planned at the largest
point of its range that fits the largest registered node (each budget at its max, or at
what that node holds), or at its max when no node is registered.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from wstrain.contracts.calibration import GIB
from wstrain.contracts.errors import InfeasibleBudget, InvalidSpec
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.jobs import Node
from wstrain.contracts.plan import Plan, RangePoint
from wstrain.contracts.spec import JobSpec
from wstrain.contracts.step_shape import step_tokens

# min, three points between, max: what memory buys, at most five plans beside the job's own
# (10-75 ms each for the presets; the plan cache makes a sweep's repeats free)
RANGE_POINTS = 5
# wall time the points may take in all: the submission's deadline (WSTRAIN_PLAN_TIMEOUT_S,
# 2 s by default) is for the job's own plan first; points past this are listed unplanned
RANGE_POINTS_S = 0.8


def _capacity(node: Node) -> tuple[int, int, bool]:
    """(device, host) bytes of a node as pick_node sees it (its largest GPU, or on a CPU
    node its host memory, and its host memory), and whether it is a CPU node, whose jobs
    take device x gpus + host out of its one pool (agent/capacity.py)."""
    dev = max((g.total_bytes for g in node.gpus), default=node.host_total_bytes)
    return dev, node.host_total_bytes, not node.gpus


def _floor_cgib(gib: float) -> float:
    """Down to a hundredth of a GiB: a point a user reads (139.8, not 139.8046875)."""
    return math.floor(gib * 100 + 1e-6) / 100  # 1e-6: 13.999999999999998 is 14


def _largest_point(
    spec: JobSpec, dev_bytes: int, host_bytes: int, one_pool: bool
) -> tuple[float, float] | None:
    """The largest point of `spec`'s ranges a node of this capacity holds, or None. On a
    CPU node both budgets come out of host memory: each grows from its min by the same
    share of its range until the pool is full."""
    (dev_lo, dev_hi), (host_lo, host_hi) = spec.budget.device_range_gib, spec.budget.host_range_gib
    dev_gib, host_gib = dev_bytes / GIB, host_bytes / GIB
    if dev_lo > dev_gib or host_lo > host_gib:
        return None
    if not one_pool:
        dev = max(dev_lo, min(dev_hi, _floor_cgib(dev_gib)))
        return dev, max(host_lo, min(host_hi, _floor_cgib(host_gib)))
    spare = host_gib - dev_lo * spec.gpus - host_lo
    if spare < 0:
        return None
    room = (dev_hi - dev_lo) * spec.gpus + (host_hi - host_lo)
    if room <= spare:
        return dev_hi, host_hi
    share = spare / room
    return (
        max(dev_lo, _floor_cgib(dev_lo + share * (dev_hi - dev_lo))),
        max(host_lo, _floor_cgib(host_lo + share * (host_hi - host_lo))),
    )


def choose_point(spec: JobSpec, nodes: list[Node]) -> tuple[float, float]:
    """(device_gib, host_gib) to plan `spec` at: a fixed budget's numbers; for a range, the
    largest point that fits the largest node, or the ranges' max with no node. InvalidSpec
    naming budget.device_gib (or host_gib) when a range's min is above every node."""
    (dev_lo, dev_hi), (host_lo, host_hi) = spec.budget.device_range_gib, spec.budget.host_range_gib
    if not spec.budget.ranged or not nodes:
        return dev_hi, host_hi
    caps = [_capacity(n) for n in nodes]
    fits = [p for p in (_largest_point(spec, *c) for c in caps) if p is not None]
    if fits:
        return max(fits)
    largest_dev, largest_host = max(c[0] for c in caps) / GIB, max(c[1] for c in caps) / GIB
    if largest_dev < dev_lo:
        field, low, largest, what = "device_gib", dev_lo, largest_dev, "device memory"
    elif largest_host < host_lo or not all(c[2] for c in caps):
        field, low, largest, what = "host_gib", host_lo, largest_host, "host memory"
    else:  # CPU nodes only: the two mins together are more than one holds
        field, low, largest = "device_gib", dev_lo, largest_host - host_lo
        what = f"host memory less the host min ({host_lo:g} GiB; a CPU node holds both)"
    raise InvalidSpec(
        f"budget.{field}: the range's min={low:g} GiB is above every node's {what} "
        f"(largest {largest:.1f} GiB; device {largest_dev:.1f} and host {largest_host:.1f} "
        f"GiB on the largest nodes); lower min to at most {_floor_cgib(max(largest, 0)):g}",
        field=f"budget.{field}",
    )


def _points(spec: JobSpec) -> list[tuple[float, float]]:
    """RANGE_POINTS points from the ranges' min to their max, evenly spaced (both budgets
    together where both are ranges), inner ones rounded to a hundredth of a GiB."""
    (dev_lo, dev_hi), (host_lo, host_hi) = spec.budget.device_range_gib, spec.budget.host_range_gib
    out: list[tuple[float, float]] = []
    for i in range(RANGE_POINTS):
        t = i / (RANGE_POINTS - 1)
        dev = dev_lo if i == 0 else dev_hi if t == 1 else round(dev_lo + (dev_hi - dev_lo) * t, 2)
        host = (
            host_lo
            if i == 0
            else host_hi
            if t == 1
            else round(host_lo + (host_hi - host_lo) * t, 2)
        )
        if (dev, host) not in out:  # a narrow range has fewer distinct points
            out.append((dev, host))
    return out


def _holds(node: NodeProfile) -> str:
    host = node.host_total_bytes / GIB
    if node.device == "cpu":
        return f"{host:.1f} GiB of host memory for device x gpus + host"
    return f"device {node.device_total_bytes / GIB:.1f} GiB, host {host:.1f} GiB"


def range_points(
    spec: JobSpec, node: NodeProfile, plan: Callable[[JobSpec], Plan]
) -> list[RangePoint]:
    """A ranged spec's points, each planned with `plan` on `node` (the node its own plan was
    made for): predicted tokens/s, or why not (over what the node holds, a budget too
    small for the model, or the points' time spent)."""
    tokens = step_tokens(spec.global_batch, spec.seq_len)
    started = time.perf_counter()
    out: list[RangePoint] = []
    for dev, host in _points(spec):
        refused = None
        pool = (dev * spec.gpus + host) * GIB if node.device == "cpu" else 0  # one pool
        if (
            dev * GIB > node.device_total_bytes
            or host * GIB > node.host_total_bytes
            or pool > node.host_total_bytes
        ):
            refused = f"more than the node it is planned for holds ({_holds(node)})"
        elif time.perf_counter() - started > RANGE_POINTS_S:
            refused = f"not planned: the range's points took over {RANGE_POINTS_S} s of planning"
        if refused is not None:
            out.append(RangePoint(device_gib=dev, host_gib=host, refused=refused))
            continue
        try:
            p = plan(spec.at_budget(dev, host))
        except (InfeasibleBudget, InvalidSpec) as exc:
            out.append(RangePoint(device_gib=dev, host_gib=host, refused=exc.message))
            continue
        step_s = p.predicted.step_seconds
        out.append(
            RangePoint(
                device_gib=dev,
                host_gib=host,
                runtime=p.runtime,
                step_seconds=step_s,
                tokens_per_s=tokens / step_s if step_s > 0 else None,
            )
        )
    return out
