"""Data parallelism in a plan: a job on `gpus` GPUs of one node runs one process (rank) per
GPU, each training global_batch/gpus sequences a step under the per-GPU device budget. The
planners plan one rank (`rank_spec`); this module adds what the ranks cost together.

Host memory. The ranks share one host copy of the training state (weights, gradients,
moments, the fp32 master): it is counted once. Each rank's private host bytes (its store of
offloaded activations, its process and the checkpoint shard it stages: the reserve of
contracts/calibration.py host_reserve_bytes) count once per rank:

    host = shared state + ranks x private      (memory_model.host_bytes, resident.host_peak_bytes)

Step time. Every rank computes the same step, then the gradients are summed over the ranks:
a ring all-reduce sends 2(N-1)/N of the gradient bytes over each GPU's link, at the node's
all-reduce bus bandwidth (ALLREDUCE_BUS_BYTES_PER_S over NVLink; on CPU, gloo at the host's
memcpy rate), once a round on the working set (each round's gradients go home summed),
once a step on the resident runtime. The term is counted in full, not overlapped with
backward.

    plan = with_ranks(make_ws_plan(rank_spec(spec), dims, node), spec, dims, node)

Several nodes (`nodes` = M): each node runs `gpus` ranks as above and keeps its own host
copy, so host and device budgets are per node and per GPU exactly as for one node; a rank
trains global_batch/(gpus x nodes) sequences, and the all-reduce spans gpus x nodes ranks
(counted at the same bus bandwidth: the planner has no measure of the network between
nodes, so a multi-node step prediction is a lower bound).
"""

from __future__ import annotations

from wstrain.contracts.calibration import ALLREDUCE_BUS_BYTES_PER_S, ELEMENT_BYTES
from wstrain.contracts.errors import InvalidSpec
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec


def rank_spec(spec: JobSpec) -> JobSpec:
    """The job one rank plans: global_batch/(gpus x nodes) sequences a step. `gpus` stays,
    so the host accounting counts a node's ranks' private bytes (so this copy is not a valid
    spec to submit: its global_batch need not divide by gpus; it is never validated again)."""
    ranks = spec.gpus * spec.nodes
    if ranks == 1:
        return spec
    per_rank = spec.global_batch // ranks  # JobSpec checked that gpus x nodes divides it
    mb = spec.overrides.micro_batch
    if mb is not None and per_rank % mb:
        ranks_of, share = f"gpus={spec.gpus}", "global_batch/gpus"
        if spec.nodes > 1:
            ranks_of, share = f"{ranks_of} x nodes={spec.nodes}", "global_batch/(gpus x nodes)"
        raise InvalidSpec(
            f"overrides.micro_batch={mb} must divide the sequences each of {ranks_of} "
            f"trains a step, {share} = {per_rank}; pick a divisor of {per_rank}"
        )
    return spec.model_copy(update={"global_batch": per_rank})


def allreduce_seconds(dims: ModelDims, precision: str, ranks: int, node: NodeProfile) -> float:
    """Seconds of one step's gradient all-reduce over `ranks` ranks: 2(N-1)/N x the
    gradient bytes (the streamed element size a parameter) / the bus bandwidth."""
    if ranks <= 1:
        return 0.0
    grad_bytes = dims.params * ELEMENT_BYTES[precision]
    bus_bytes_per_s = ALLREDUCE_BUS_BYTES_PER_S if node.device == "cuda" else node.h2d_bytes_per_s
    return 2 * (ranks - 1) / ranks * grad_bytes / bus_bytes_per_s


def with_ranks(plan: Plan, spec: JobSpec, dims: ModelDims, node: NodeProfile) -> Plan:
    """The one-rank `plan` of `spec` as the plan of all its ranks: `ranks`, the all-reduce
    in the predicted step, and the reasons that say so. Unchanged for gpus=1 on one node."""
    if spec.gpus * spec.nodes == 1:
        return plan
    ranks, nodes = spec.gpus, spec.nodes
    # the working set sums each layer's gradients every round (its slot goes home between
    # rounds: working_set/data_parallel.py); the resident runtime once a step
    sums = plan.rounds if plan.runtime == "working_set" else 1
    reduce_s = sums * allreduce_seconds(dims, spec.precision, ranks * nodes, node)
    predicted = plan.predicted.model_copy(
        update={
            "step_seconds": plan.predicted.step_seconds + reduce_s,
            "allreduce_seconds": reduce_s,
        }
    )
    reasons = dict(plan.reasons)
    per_rank = spec.global_batch // (ranks * nodes)
    of_nodes = f" x {nodes} nodes" if nodes > 1 else ""
    reasons["rounds"] = (
        f"{plan.rounds} a rank = global_batch {spec.global_batch} / (micro_batch "
        f"{plan.micro_batch} x {ranks} ranks{of_nodes})"
    )
    link = "NVLink all-reduce" if node.device == "cuda" else "gloo all-reduce at host memcpy rate"
    host = "host AdamW on the shared host state; " if plan.runtime == "working_set" else ""
    reasons["ranks"] = (
        f"{ranks} ranks, one per GPU, data parallel: each trains {per_rank} of the "
        f"{spec.global_batch} sequences a step under device_gib={spec.budget.device_gib} of "
        f"its own; {host}host memory counts the shared training state once and each rank's "
        f"activations, process and staging {ranks} times; + {reduce_s:.3g} s a step for the "
        f"gradients' {link}"
    )
    if nodes > 1:
        reasons["nodes"] = (
            f"{nodes} nodes of {ranks} rank(s): {ranks * nodes} ranks in all, each node with "
            "its own host copy under host_gib; the all-reduce over the network between nodes "
            "is counted at the in-node rate (a lower bound)"
        )
    update = {"ranks": ranks, "nodes": nodes, "predicted": predicted, "reasons": reasons}
    return plan.model_copy(update=update)
