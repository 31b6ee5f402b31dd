"""The planner: (JobSpec, model dims, node profile) -> Plan, or the smallest budgets that work.

This is the resident-runtime planner (the baseline; the autoconfigurator issue replaces the
memory model with the working-set one). It is torch-free so the API can dry-run plans.

    python -c "from wstrain.scheduler.planning.planner import *"   # imported by service/ and scheduler/agent/agent.py
"""

from __future__ import annotations

from wstrain.scheduler.contracts.jobs import GIB, JobSpec, MinBudget, Plan, Predicted
from wstrain.scheduler.contracts.errors import InfeasibleBudget, InvalidSpec
from wstrain.scheduler.contracts.hardware import NodeProfile
from wstrain.scheduler.contracts.model_dims import STATE_BYTES_PER_PARAM, ModelDims

ELEMENT_BYTES = {"bf16": 2, "mixed": 2, "fp32": 4}
# Fixed device reserve: kernel workspaces, allocator fragmentation, RNG/loss scalars.
DEVICE_RESERVE_BYTES = 256 * 1024**2
# The caching allocator's reserved peak over the bytes we count: the resident 16-layer 8B
# row reserved 73.0 GiB where the terms below add up to 64.5 (bench/RESULTS.md); the
# working-set rows fit 1.18 as well. Budgets are a contract, so over-predict.
ALLOCATOR_SLACK = 1.18
# Host memory a worker process needs before any model state: interpreter, torch, CUDA/MKL
# runtimes, data loader buffers.
HOST_PROCESS_BYTES = 768 * 1024**2


def activation_bytes_per_token(dims: ModelDims, precision: str) -> int:
    """Bytes autograd saves per token per layer in the resident model: inputs, norm outputs,
    q/k/v, attention output, residual, SwiGLU gate/up/silu/product, fp32 norm copies; a MoE
    layer's k experts add each routed copy of the input and its weighted output, and the
    router's fp32 probabilities."""
    e = ELEMENT_BYTES[precision]
    d, kv = dims.hidden_size, dims.num_kv_heads * dims.head_dim
    q = dims.num_heads * dims.head_dim
    routed = (2 * dims.experts_per_token * d * e + 8 * dims.num_experts) if dims.is_moe else 0
    return e * (4 * d + 2 * q + 2 * kv + 4 * dims.ffn_width) + 8 * d + routed


def logits_bytes_per_token(dims: ModelDims, precision: str) -> int:
    # logits at working precision plus the fp32 log-softmax kept for backward
    return dims.vocab_size * (ELEMENT_BYTES[precision] + 4)


def device_peak_bytes(dims: ModelDims, precision: str, seq_len: int, micro_batch: int) -> int:
    tokens = seq_len * micro_batch
    state = dims.params * STATE_BYTES_PER_PARAM[precision]
    acts = tokens * dims.num_layers * activation_bytes_per_token(dims, precision)
    logits = tokens * logits_bytes_per_token(dims, precision)
    return int((state + acts + logits + DEVICE_RESERVE_BYTES) * ALLOCATOR_SLACK)


def host_peak_bytes(dims: ModelDims) -> int:
    # A checkpoint stages one copy of the weights in host memory; on a CPU node the
    # training state itself is counted against the device budget.
    staged = dims.params * 4
    return HOST_PROCESS_BYTES + staged


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def min_budget(spec: JobSpec, dims: ModelDims) -> MinBudget:
    dev = device_peak_bytes(dims, spec.precision, spec.seq_len, 1)
    host = host_peak_bytes(dims)
    round_up = lambda b: round(b / GIB + 0.005, 2)  # noqa: E731 - GiB, rounded up to 0.01
    return MinBudget(device_gib=round_up(dev), host_gib=round_up(host))


def make_plan(spec: JobSpec, dims: ModelDims, node: NodeProfile) -> Plan:
    """The faster of the resident and the working-set plan that fit the budgets (the cost
    model decides); `overrides.runtime` forces either. InfeasibleBudget names the smallest
    budgets of whichever runtime needs less device memory."""
    from wstrain.scheduler.planning.working_set import make_ws_plan  # it builds on this module's terms

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
                f"{other.predicted.step_seconds:.3g} s {other.runtime}; both fit the budgets")
        elif best.runtime == "working_set":
            need = errors[0].detail["min_budget"]  # type: ignore[index]
            best.reasons["runtime"] = (
                f"working_set: the resident model needs device_gib >= {need['device_gib']} "
                f"and host_gib >= {need['host_gib']}")
        return best
    # Name whichever runtime's minimum asks for less device memory.
    raise min(errors, key=lambda e: e.detail["min_budget"]["device_gib"])  # type: ignore[index]


def make_resident_plan(spec: JobSpec, dims: ModelDims, node: NodeProfile) -> Plan:
    """The fastest resident plan under the spec's budgets; InfeasibleBudget if none fits."""
    if spec.seq_len > dims.max_position_embeddings:
        raise InvalidSpec(
            f"seq_len={spec.seq_len} exceeds the model's max_position_embeddings="
            f"{dims.max_position_embeddings}; lower seq_len"
        )
    dev_budget, host_budget = spec.budget.device_bytes, spec.budget.host_bytes
    host = host_peak_bytes(dims)
    candidates = _divisors(spec.global_batch)
    if spec.overrides.micro_batch is not None:
        if spec.global_batch % spec.overrides.micro_batch:
            raise InvalidSpec(
                f"overrides.micro_batch={spec.overrides.micro_batch} must divide "
                f"global_batch={spec.global_batch}"
            )
        candidates = [spec.overrides.micro_batch]
    fitting = [mb for mb in candidates
               if device_peak_bytes(dims, spec.precision, spec.seq_len, mb) <= dev_budget]
    if not fitting or host > host_budget:
        need = min_budget(spec, dims)
        raise InfeasibleBudget(
            f"budget device_gib={spec.budget.device_gib}, host_gib={spec.budget.host_gib} "
            f"cannot hold {dims.params / 1e6:.1f}M parameters at seq_len={spec.seq_len}; "
            f"raise the budget to at least device_gib={need.device_gib}, "
            f"host_gib={need.host_gib}",
            min_budget=need.model_dump(),
        )
    from wstrain.scheduler.planning.cost_model import chunk_times

    micro_batch = max(fitting)
    rounds = spec.global_batch // micro_batch
    fwd_s, bwd_s = chunk_times(dims, spec.seq_len, node)
    head_s = 6 * spec.seq_len * dims.embedding_params / node.matmul_flops
    compute_s = spec.global_batch * (dims.num_layers * (fwd_s + bwd_s) + head_s)
    peak_dev = device_peak_bytes(dims, spec.precision, spec.seq_len, micro_batch)
    device = spec.overrides.device or node.device
    # On a GPU the resident AdamW is a fused kernel over HBM (~14 bytes a parameter at
    # ~3 TB/s); on a CPU node it runs at the profiled CPU rate.
    optimizer_s = (dims.params * 14 / 3e12 if device == "cuda"
                   else dims.params / node.optimizer_params_per_s)
    return Plan(
        runtime="resident",
        device=device,
        micro_batch=micro_batch,
        rounds=rounds,
        window=dims.num_layers,
        layers=dims.num_layers,
        params=dims.params,
        predicted=Predicted(step_seconds=compute_s + optimizer_s, peak_device_bytes=peak_dev,
                            peak_host_bytes=host, compute_seconds=compute_s,
                            recompute_seconds=0.0, exposed_transfer_seconds=0.0,
                            optimizer_seconds=optimizer_s),
        reasons={
            "runtime": "resident: every layer, its state and its activations stay on the "
                       "device; fits the budget and predicts the fastest step",
            "micro_batch": (f"{micro_batch} of {spec.global_batch} sequences: the largest "
                            f"divisor of global_batch whose predicted peak "
                            f"{peak_dev / GIB:.2f} GiB fits device_gib={spec.budget.device_gib}"),
            "rounds": f"{rounds} = global_batch {spec.global_batch} / micro_batch {micro_batch}",
            "window": f"all {dims.num_layers} layers resident",
            "device": f"{device}: the node's accelerator"
                      + (" (override)" if spec.overrides.device else ""),
            "step_seconds": (f"{compute_s + optimizer_s:.3g} s = {compute_s:.3g} compute at "
                             f"{node.matmul_flops / 1e12:.3g} TFLOP/s GEMMs + "
                             f"{optimizer_s:.3g} optimizer"),
        },
    )
