"""When each queued job will start and end, as GET /v1/queue, GET /v1/jobs/{id} and the
queue gauge show it: the store's views (the queue's head, the placed jobs with their step,
steps and step times, the registered nodes) turned into the pure forecast's inputs
(policy/forecast.py), which runs off the event loop (500 queued jobs: up to ~1.7 s of CPU).

A running job ends after its remaining steps at its last reported step time (the plan's
predicted one before its first step); a queued job runs its remaining steps at the plan's
predicted step time. A job stopped (cancelled, preempted, shrunk) leaves STOP_S after its
step in flight ends: half a step on average (policy/replay.py stop_after), the last one it
reported (a cancelled job before its first: the plan's; a preempted one then leaves at once).
A job on several nodes is not forecast (one node's replay cannot place it), nor one past
the queue's head.

    forecasts = await queue_forecast(store, settings.policy_config())
    forecasts[job_id].start_s, .end_s, .reason
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from wstrain.contracts.jobs import JobState, Node
from wstrain.policy import (
    Forecast,
    ForecastNode,
    Gpu,
    NodeState,
    PolicyConfig,
    RunningJob,
    Usage,
    forecast,
    run_seconds,
    stop_after,
)
from wstrain.store import JobStore
from wstrain.store.grants import GrantStore
from wstrain.store.scheduling import PendingRow, PlacedRow, ProgressRow, SchedulingView

QUEUE_HEAD = 500  # as many as an agent's round considers (agent/scheduling.py)
STOP_S = 30.0  # a preempted worker's checkpoint and exit, as the forecast assumes it
MULTI_NODE = "a job on several nodes is not forecast"


async def queue_forecast(
    st: JobStore, config: PolicyConfig, rows: Sequence[PendingRow] | None = None
) -> dict[str, Forecast]:
    """Every job of the queue's head: its Forecast (`rows`: the head, when read already)."""
    view = SchedulingView(st)
    now = time.time()
    if rows is None:
        rows = await view.pending(QUEUE_HEAD)
    if not rows:
        return {}
    placed = await view.placed()
    nodes = await st.nodes()
    progress = await view.progress([r.id for r in rows] + [p.id for p in placed])
    deps = sorted({d for r in rows for d in r.after})
    states = {k: JobState(v) for k, v in (await view.states(deps)).items() if v}
    usage = {o: Usage(u, now) for o, u in (await view.usage(now, config.half_life_s)).items()}
    # a job admitted under a priority grant is decided at min(its class, the grant now), as
    # the agents' rounds decide it (agent/scheduling.py)
    caps = await GrantStore(st).caps(
        [(r.id, r.owner, r.priority) for r in rows] + [(p.id, p.owner, p.priority) for p in placed]
    )
    rows = [replace(r, priority=caps[r.id]) if r.id in caps else r for r in rows]
    placed = [replace(p, priority=caps[p.id]) if p.id in caps else p for p in placed]
    return await asyncio.to_thread(
        compute, now, rows, placed, nodes, progress, usage, config, states
    )


def compute(
    now: float,
    rows: Sequence[PendingRow],
    placed: Sequence[PlacedRow],
    nodes: Sequence[Node],
    progress: Mapping[str, ProgressRow],
    usage: Mapping[str, Usage],
    config: PolicyConfig,
    states: Mapping[str, JobState],
) -> dict[str, Forecast]:
    """The store's rows as the forecast's inputs, and its answer (CPU only)."""
    ends: dict[str, float | None] = {}
    # a preempted worker that has reported no step of this run is not waited for
    # (agent/stops.py); a cancelled one ends its step in flight, the first one too
    steps = {j: prog.step_s for j, prog in progress.items()}
    on: dict[str, list[RunningJob]] = {n.name: [] for n in nodes}
    for p in placed:
        prog = progress.get(p.id)
        if p.state == JobState.cancelling.value:  # it stops at its next step, checkpointed
            step_s = None if prog is None else prog.step_s or prog.predicted_step_s
            ends[p.id] = now + stop_after(STOP_S, step_s)
        elif prog is None:
            ends[p.id] = None
        else:
            step_s = prog.step_s or prog.predicted_step_s
            left = run_seconds(prog.steps - prog.step, step_s)
            ends[p.id] = None if left is None else now + left
        if p.node in on:
            exclusive = prog.exclusive if prog is not None else False
            on[p.node].append(p.running(exclusive, p.state == JobState.cancelling.value))
    pending, durations, out = [], {}, {}
    for r in rows:
        if r.nodes > 1:
            out[r.id] = Forecast(r.id, None, None, MULTI_NODE)
            continue
        pending.append(r.pending())
        prog = progress.get(r.id)
        durations[r.id] = (
            None if prog is None else run_seconds(prog.steps - prog.step, prog.predicted_step_s)
        )
    targets = [
        ForecastNode(n.name, _node_state(n), tuple(on[n.name])) for n in nodes if n.name in on
    ]
    out |= forecast(
        now, pending, targets, ends, durations, usage, config, states, STOP_S, step_s=steps
    )
    return out


def _node_state(node: Node) -> NodeState:
    """The node as the policy models it (agent/capacity.py's node_state)."""
    gpus = () if node.device == "cpu" else tuple(Gpu(g.index, g.total_bytes) for g in node.gpus)
    return NodeState(gpus=gpus, host_bytes=node.host_total_bytes)
