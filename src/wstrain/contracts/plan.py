"""What the autoconfigurator decides for a job (planning/): Plan, its working-set
part and its predictions, and the smallest budgets a refused job would need."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    Field,
)

from wstrain.contracts.calibration import WRITE_BUFFER_BYTES
from wstrain.contracts.spec import JobSpec, Runtime
from wstrain.contracts.spec_fields import MAX_BUDGET_GIB

# ---------------------------------------------------------------- plan


class Predicted(BaseModel):
    step_seconds: float
    peak_device_bytes: int
    peak_host_bytes: int
    peak_disk_bytes: int = 0  # the spill file (WorkingSetPlan.spilled_layers)
    # The step's breakdown (they sum to step_seconds): compute at the node's profiled rates,
    # recomputation in backward, transfers not hidden behind compute, exposed optimizer,
    # and with several ranks the gradients' all-reduce.
    compute_seconds: float | None = None
    recompute_seconds: float | None = None
    exposed_transfer_seconds: float | None = None
    optimizer_seconds: float | None = None
    # data parallel (Plan.ranks > 1): the gradients' all-reduce after each rank's step
    allreduce_seconds: float | None = None


class WorkingSetPlan(BaseModel):
    """What the working-set runtime needs beyond micro_batch/rounds/window."""

    chunk: int = Field(description="sequences per chunk")
    r_param: int
    r_grad: int
    levels: list[list[int]] = Field(
        description="saved-activation level per [layer][unit] (a unit: a sequence, or a piece "
        "of one with seq_chunk)"
    )
    loss_tokens: int
    optimizer: Literal["host", "device", "split"] = Field(
        default="host",
        description="deferred into the next step's first forward; host: CPU "
        "AdamW in a thread; device: AdamW on the device over streamed moments; split: the "
        "first device_layers layers and the embedding on the device, the others and the "
        "head on the host, both at once",
    )
    device_layers: int = Field(
        default=0, ge=0, description="split: the leading layers whose update runs on the device"
    )
    lead_rounds: int = Field(
        default=1,
        ge=1,
        description="the step's first pass carries the sequences of this "
        "many rounds: each layer's weights then serve more compute while the deferred "
        "optimizer update of the last step arrives layer by layer",
    )
    seq_chunk: int = Field(
        default=0,
        ge=0,
        description="tokens per piece of a sequence (long context: a layer runs "
        "each sequence a piece at a time against a window of its keys and values, and levels "
        "are per [layer][sequence x piece]); 0 = whole sequences",
    )
    window_home: bool = Field(
        default=False,
        description="with seq_chunk: the window of keys and values and their fp32 gradient "
        "sums in pinned host memory, a 64K-key block at a time on the device (12 GiB less "
        "device at 1M tokens, for the link's traffic)",
    )
    attention_kernel: str = Field(
        default="",
        description="the kernel the attention runs: with seq_chunk a piece's, else a whole "
        "sequence's (sdpa, or fa3-hopper where FlashAttention-3 runs)",
    )
    overlap: bool = Field(
        default=False,
        description="cross-round overlap: every pass after the step's first runs its forward "
        "layer by layer beside the previous pass's backward",
    )
    write_buffer_bytes: int = Field(
        default=WRITE_BUFFER_BYTES,
        gt=0,
        description="saved activations in flight to the host at most (device memory): a "
        "forward that would exceed it waits for the oldest copy, and backward prefetches "
        "sets this far ahead",
    )
    spilled_layers: int = Field(
        default=0,
        ge=0,
        description="the disk tier: the last N decoder layers' AdamW moments live in a "
        "preallocated file in the spill directory (budget.disk_gib) instead of host memory; "
        "the host AdamW reads and writes them through a bounded buffer beside its update",
    )
    first_levels: list[list[int]] = Field(
        default_factory=list,
        description="the step's first pass's levels per [layer][unit] where they differ from "
        "levels (with overlap: the first pass has no backward beside it); [] = levels",
    )


class RangePoint(BaseModel):
    """A ranged budget's point and what the planner predicts there (POST /v1/plans shows
    what memory buys): tokens/s, or why it cannot plan that point."""

    device_gib: float = Field(gt=0, le=MAX_BUDGET_GIB)
    host_gib: float = Field(gt=0, le=MAX_BUDGET_GIB)
    runtime: Runtime | None = None
    step_seconds: float | None = Field(default=None, ge=0)
    tokens_per_s: float | None = Field(
        default=None, ge=0, description="the job's tokens a step over the predicted step time"
    )
    refused: str | None = Field(default=None, description="why no plan fits this point")


class Plan(BaseModel):
    runtime: Runtime = "resident"
    device: Literal["cpu", "cuda"]
    micro_batch: int
    rounds: int
    ranks: int = Field(
        default=1,
        ge=1,
        description="processes a node, one per GPU; rounds and micro_batch are per rank",
    )
    nodes: int = Field(default=1, ge=1, description="nodes, each running `ranks` ranks")
    window: int = Field(description="layers resident on the device at once")
    layers: int
    params: int
    predicted: Predicted
    reasons: dict[str, str]
    working_set: WorkingSetPlan | None = None
    device_gib: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BUDGET_GIB,
        description="the device budget (GiB, per GPU) it was planned for: a fixed budget's, "
        "or the point of a ranged one; the worker enforces this one",
    )
    host_gib: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BUDGET_GIB,
        description="the host budget (GiB) it was planned for; the worker enforces this one",
    )
    range_points: list[RangePoint] = Field(
        default_factory=list,
        max_length=8,
        description="a ranged budget: a few points from its min to its max, each planned",
    )
    inputs_digest: str = Field(
        default="",
        description="sha256 of what it was planned from: the spec less its name, the model's "
        "dims, the node profile and the runtime a resumed attempt keeps "
        "(planning/planner.py plan_inputs_digest); the agent launches the plan the job was "
        "admitted with when its own inputs give the same digest, and plans again otherwise",
    )


class MinBudget(BaseModel):
    device_gib: float
    host_gib: float
    # the disk tier's size that holds what the host budget cannot (absent: it would not help)
    disk_gib: float = Field(default=0.0, exclude_if=lambda v: v == 0)


def at_plan_budget(spec: JobSpec, plan: Plan) -> JobSpec:
    """`spec` with fixed budgets at the point `plan` was made for (what a worker enforces);
    `spec` at its chosen point for a plan that does not record one."""
    if plan.device_gib is None or plan.host_gib is None:
        return spec.at_chosen()
    return spec.at_budget(plan.device_gib, plan.host_gib)
