"""The autoconfigurator's entry point: (JobSpec, model dims, node profile) -> the faster of
the resident and the working-set plan that fit the budgets, or the smallest budgets that
work. Torch-free: the API plans a job on submission with it, and the agent launches that
plan, or plans again with it where its node differs from the one the API planned for.

    plan = make_plan(spec, dims, node)   # InfeasibleBudget carries min_budget
    plan = launch_plan(job.plan, spec, dims, node, resumes_runtime)   # the agent

A plan is a pure function of its inputs, so it records their digest (Plan.inputs_digest)
and the agent reuses the submitted plan when its own inputs give the same one. They differ
wherever the agent knows more than the API did: on a GPU node the job's layer measured
there (agent/hardware.py layer_times), a GPU shared with packed jobs, a document span read
from the whole index (the API samples 65,536 documents), a resumed attempt's runtime, or a
node other than the largest one the API planned for; then the same function plans again.
"""

from __future__ import annotations

import hashlib

from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec
from wstrain.planning.ranks import rank_spec, with_ranks
from wstrain.planning.resident import make_resident_plan
from wstrain.planning.working_set import make_ws_plan


def make_plan(
    spec: JobSpec, dims: ModelDims, node: NodeProfile, resumes_runtime: str | None = None
) -> Plan:
    """The faster of the resident and the working-set plan that fit the budgets (the cost
    model decides); `overrides.runtime` forces either, and so does `resumes_runtime`, the
    runtime whose checkpoint the job resumes from (the two keep their optimizer state in
    different forms, so an attempt requeued onto another node keeps its first runtime).
    InfeasibleBudget names the smallest budgets of whichever runtime needs less device
    memory. A seq_len past the model's max_position_embeddings is planned, with a warning
    in reasons["seq_len"]: RoPE has no table to outgrow, and the bench trains 4K-position
    models at 8K. A job on several GPUs is planned as one rank of global_batch/gpus
    sequences (planning/ranks.py). A ranged budget is planned at its chosen point
    (JobSpec.at_chosen), which the plan records (device_gib, host_gib)."""
    spec = spec.at_chosen()
    digest = plan_inputs_digest(spec, dims, node, resumes_runtime)
    if resumes_runtime is not None and spec.overrides.runtime is None:
        pinned = spec.overrides.model_copy(update={"runtime": resumes_runtime})
        spec = spec.model_copy(update={"overrides": pinned})
    rank_node = node.for_ranks(spec.gpus)  # its GPU's link as the node's ranks share it
    plan = with_ranks(_fastest(rank_spec(spec), dims, rank_node), spec, dims, node)
    plan.inputs_digest = digest
    plan.device_gib, plan.host_gib = spec.budget.device_gib, spec.budget.host_gib
    if rank_node is not node:
        plan.reasons["ranks"] += (
            f"; each rank's device-to-host rate {rank_node.d2h_bytes_per_s / 1e9:.0f} GB/s "
            f"(measured with {spec.gpus} GPUs copying at once; "
            f"{node.d2h_bytes_per_s / 1e9:.0f} alone)"
        )
    if resumes_runtime is not None:
        plan.reasons["runtime"] = (
            f"{plan.runtime}: the runtime of the checkpoint this attempt resumes from"
        )
    if spec.seq_len > dims.max_position_embeddings:
        plan.reasons["seq_len"] = (
            f"warning: seq_len={spec.seq_len} exceeds the model's max_position_embeddings="
            f"{dims.max_position_embeddings}; positions past it were not seen in "
            "pre-training, so a pretrained model may extrapolate poorly (a model with "
            "rope_scaling in its hf_config, or a shorter seq_len, avoids it)"
        )
    return plan


def plan_inputs_digest(
    spec: JobSpec, dims: ModelDims, node: NodeProfile, resumes_runtime: str | None = None
) -> str:
    """sha256 of everything make_plan reads: the spec less its name (no plan depends on
    it), the model's dims, the node profile (its measured layer and document span
    included) and the runtime a resumed attempt keeps. Floats go in by repr, exactly. A
    ranged budget counts as the fixed budget of its chosen point: the same plan."""
    text = "\0".join(
        (
            spec.at_chosen().model_dump_json(exclude={"name"}),
            repr(dims),
            repr(node),
            resumes_runtime or "",
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()


def launch_plan(
    submitted: Plan | None,
    spec: JobSpec,
    dims: ModelDims,
    node: NodeProfile,
    resumes_runtime: str | None = None,
) -> Plan:
    """The plan make_plan gives for these inputs: `submitted` (the plan the job was admitted
    or last launched with, as stored) unchanged when it was made from the same inputs, so
    the agent does not plan it again (10-75 ms of CPU a preset); else make_plan's."""
    if submitted is not None and submitted.inputs_digest == plan_inputs_digest(
        spec, dims, node, resumes_runtime
    ):
        return submitted
    return make_plan(spec, dims, node, resumes_runtime)


def _fastest(spec: JobSpec, dims: ModelDims, node: NodeProfile) -> Plan:
    if spec.overrides.runtime == "working_set":
        return make_ws_plan(spec, dims, node)
    if spec.overrides.runtime == "resident":
        return make_resident_plan(spec, dims, node)
    plans, errors = [], []
    for make in (make_resident_plan, make_ws_plan):
        try:
            plans.append(make(spec, dims, node))
        except InfeasibleBudget as exc:
            errors.append(exc)
    if plans:
        best = min(plans, key=lambda p: p.predicted.step_seconds)
        if len(plans) == 2:
            other = plans[1] if best is plans[0] else plans[0]
            best.reasons["runtime"] = (
                f"{best.runtime}: predicted {best.predicted.step_seconds:.3g} s a step against "
                f"{other.predicted.step_seconds:.3g} s {other.runtime}; both fit the budgets"
            )
        elif best.runtime == "working_set":
            need = errors[0].min_budget
            best.reasons["runtime"] = (
                f"working_set: the resident model needs device_gib >= {need['device_gib']} "
                f"and host_gib >= {need['host_gib']}"
            )
        return best
    # Name whichever runtime's minimum asks for less device memory.
    raise min(errors, key=lambda e: e.min_budget["device_gib"])
