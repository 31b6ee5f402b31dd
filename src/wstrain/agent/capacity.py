"""What this node holds and has left, as the scheduling policy and /metrics see it: its
GPUs and host memory, the jobs on them with their budgets, and what each device could still
give a new job. A GPU node packs jobs by their device budgets (the budget is each worker's
allocator limit, so packed jobs cannot take each other's memory); a CPU node's one
"device" is host memory, shared by both budgets. A job on several GPUs holds its device
budget on each, its host budget once.

Used by agent/agent.py.
"""

from __future__ import annotations

from collections.abc import Iterable

from wstrain.agent.supervisor import WorkerHandle
from wstrain.contracts.jobs import GPUInfo
from wstrain.policy import Gpu, NodeState, RunningJob


def node_state(gpus: list[GPUInfo], host_total_bytes: int, disk_bytes: int = 0) -> NodeState:
    """The node as the policy packs it; `disk_bytes`: its spill directory's space."""
    return NodeState(
        gpus=tuple(Gpu(g.index, g.total_bytes) for g in gpus),
        host_bytes=host_total_bytes,
        disk_bytes=disk_bytes,
    )


def running_jobs(handles: Iterable[WorkerHandle]) -> list[RunningJob]:
    """The node's workers as the policy counts them; one being stopped (cancelled,
    preempted, at its time limit, the agent shutting down) still holds its memory until it
    exits but is never chosen as a victim again."""
    return [
        RunningJob(
            h.job.id,
            h.job.owner,
            h.job.spec.priority,
            h.gpus[0] if h.gpus else None,
            h.device_bytes,
            h.host_bytes,
            h.started_s,
            h.job.spec.exclusive,
            stopping=h.cancel_sent or h.timed_out or h.shutting_down or bool(h.preempted_by),
            gpus=h.job.spec.gpus,
            gang=h.gpus if len(h.gpus) > 1 else (),
            points=h.points,
            disk_bytes=h.job.spec.budget.disk_bytes if _spills(h) else 0,
        )
        for h in handles
    ]


def _spills(h: WorkerHandle) -> bool:
    """Whether the job's plan keeps moments on disk (its disk budget then reserved)."""
    return h.job.plan is not None and h.job.plan.predicted.peak_disk_bytes > 0


def free_device_bytes(
    gpus: list[GPUInfo], host_total_bytes: int, handles: Iterable[WorkerHandle]
) -> dict[str, int]:
    """Device budget a new job could still get, per device (`cuda:N`; `cpu` on a CPU node):
    0 on a GPU an exclusive job holds."""
    handles = list(handles)
    if not gpus:
        used = sum(h.device_bytes * h.job.spec.gpus + h.host_bytes for h in handles)
        return {"cpu": max(0, host_total_bytes - used)}
    free = {}
    for g in gpus:
        on = [h for h in handles if g.index in h.gpus]
        exclusive = any(h.job.spec.exclusive for h in on)
        left = g.total_bytes - sum(h.device_bytes for h in on)
        free[f"cuda:{g.index}"] = 0 if exclusive else max(0, left)
    return free


def free_host_bytes(host_total_bytes: int, handles: Iterable[WorkerHandle], gpus: bool) -> int:
    handles = list(handles)
    used = sum(h.host_bytes + (0 if gpus else h.device_bytes * h.job.spec.gpus) for h in handles)
    return max(0, host_total_bytes - used)
