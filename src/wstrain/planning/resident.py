"""The resident plan: the whole model, its optimizer state and its activations on the
device (the baseline the working set is measured against), with its memory model and the
smallest budgets it needs. Torch-free, so the API can dry-run plans.

    plan = make_resident_plan(spec, dims, node)   # InfeasibleBudget names the smallest budgets
"""

from __future__ import annotations

import math

from wstrain.contracts.calibration import (
    ALLOCATOR_SLACK,
    DEVICE_ADAMW_BYTES_PER_PARAM,
    DEVICE_MEMORY_BYTES_PER_S,
    DEVICE_RESERVE_BYTES,
    DOCUMENT_MASK_BYTES_PER_PAIR,
    ELEMENT_BYTES,
    GIB,
    PROCESS_BYTES,
)
from wstrain.contracts.errors import InfeasibleBudget, InvalidSpec
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import STATE_BYTES_PER_PARAM, ModelDims
from wstrain.contracts.plan import MinBudget, Plan, Predicted
from wstrain.contracts.spec import JobSpec
from wstrain.planning.layer_time import chunk_times, head_and_loss_s
from wstrain.planning.memory_model import activation_bytes_per_token


def logits_bytes_per_token(dims: ModelDims, precision: str) -> int:
    # logits at working precision plus the fp32 log-softmax kept for backward
    return dims.vocab_size * (ELEMENT_BYTES[precision] + 4)


def device_peak_bytes(
    dims: ModelDims, precision: str, seq_len: int, micro_batch: int, document_mask: bool = False
) -> int:
    tokens = seq_len * micro_batch
    state = dims.params * STATE_BYTES_PER_PARAM[precision]
    acts = tokens * dims.num_layers * activation_bytes_per_token(dims, precision)
    logits = tokens * logits_bytes_per_token(dims, precision)
    mask = micro_batch * seq_len**2 * DOCUMENT_MASK_BYTES_PER_PAIR * document_mask
    return int((state + acts + logits + mask + DEVICE_RESERVE_BYTES) * ALLOCATOR_SLACK)


def host_peak_bytes(dims: ModelDims, device: str, ranks: int = 1) -> int:
    # A checkpoint stages one copy of the weights in host memory; on a CPU node the
    # training state itself is counted against the device budget. Data parallel ranks each
    # keep their own model copy on their device, so nothing on the host is shared: each
    # rank's process and staging count (planning/ranks.py).
    staged = dims.params * 4
    return ranks * (PROCESS_BYTES[device] + staged)


def _divisors(n: int) -> list[int]:
    """The divisors of n in ascending order, in O(sqrt n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def min_budget(spec: JobSpec, dims: ModelDims, device: str) -> MinBudget:
    dev = device_peak_bytes(dims, spec.precision, spec.seq_len, 1, spec.document_mask)
    host = host_peak_bytes(dims, device, spec.gpus)
    round_up = lambda b: round(b / GIB + 0.005, 2)
    return MinBudget(device_gib=round_up(dev), host_gib=round_up(host))


def make_resident_plan(spec: JobSpec, dims: ModelDims, node: NodeProfile) -> Plan:
    """The fastest resident plan under the spec's budgets; InfeasibleBudget if none fits."""
    dev_budget, host_budget = spec.budget.device_bytes, spec.budget.host_bytes
    device = spec.overrides.device or node.device
    host = host_peak_bytes(dims, device, spec.gpus)
    candidates = _divisors(spec.global_batch)
    if spec.overrides.micro_batch is not None:
        if spec.global_batch % spec.overrides.micro_batch:
            raise InvalidSpec(
                f"overrides.micro_batch={spec.overrides.micro_batch} must divide "
                f"global_batch={spec.global_batch}"
            )
        candidates = [spec.overrides.micro_batch]
    fitting = [
        mb
        for mb in candidates
        if device_peak_bytes(dims, spec.precision, spec.seq_len, mb, spec.document_mask)
        <= dev_budget
    ]
    if not fitting or host > host_budget:
        need = min_budget(spec, dims, device)
        raise InfeasibleBudget(
            f"budget device_gib={spec.budget.device_gib}, host_gib={spec.budget.host_gib} "
            f"cannot hold {dims.params / 1e6:.1f}M parameters at seq_len={spec.seq_len}; "
            f"raise the budget to at least device_gib={need.device_gib}, "
            f"host_gib={need.host_gib}",
            min_budget=need.model_dump(),
        )
    micro_batch = max(fitting)
    rounds = spec.global_batch // micro_batch
    # whole sequences' attention at the rate of the kernel models/dense.py takes here
    node = node.for_piece_kernel(
        node.whole_kernel(device, spec.precision, spec.document_mask, dims.head_dim)
    )
    fwd_s, bwd_s = chunk_times(dims, spec.seq_len, node)
    head_s = head_and_loss_s(dims, spec.seq_len, node)
    compute_s = spec.global_batch * (dims.num_layers * (fwd_s + bwd_s) + head_s)
    peak_dev = device_peak_bytes(
        dims, spec.precision, spec.seq_len, micro_batch, spec.document_mask
    )
    # On a GPU the resident AdamW is a fused kernel over HBM (~14 bytes a parameter at
    # ~3 TB/s); on a CPU node it runs at the profiled CPU rate.
    optimizer_s = (
        dims.params * DEVICE_ADAMW_BYTES_PER_PARAM / DEVICE_MEMORY_BYTES_PER_S
        if device == "cuda"
        else dims.params / node.optimizer_params_per_s
    )
    return Plan(
        runtime="resident",
        device=device,
        micro_batch=micro_batch,
        rounds=rounds,
        window=dims.num_layers,
        layers=dims.num_layers,
        params=dims.params,
        predicted=Predicted(
            step_seconds=compute_s + optimizer_s,
            peak_device_bytes=peak_dev,
            peak_host_bytes=host,
            compute_seconds=compute_s,
            recompute_seconds=0.0,
            exposed_transfer_seconds=0.0,
            optimizer_seconds=optimizer_s,
        ),
        reasons={
            "runtime": "resident: every layer, its state and its activations stay on the "
            "device; fits the budget and predicts the fastest step",
            "micro_batch": (
                f"{micro_batch} of {spec.global_batch} sequences: the largest "
                f"divisor of global_batch whose predicted peak "
                f"{peak_dev / GIB:.2f} GiB fits device_gib={spec.budget.device_gib}"
            ),
            "rounds": f"{rounds} = global_batch {spec.global_batch} / micro_batch {micro_batch}",
            "window": f"all {dims.num_layers} layers resident",
            "activation_precision": "fp8 asked, not used: a resident plan keeps its "
            "activations on the device as they are; fp8 storage is the working set's"
            if spec.activation_precision == "fp8"
            else "as they are, on the device",
            "device": f"{device}: the node's accelerator"
            + (" (override)" if spec.overrides.device else ""),
            "step_seconds": (
                f"{compute_s + optimizer_s:.3g} s = {compute_s:.3g} compute at "
                f"{node.matmul_flops / 1e12:.3g} TFLOP/s GEMMs + "
                f"{optimizer_s:.3g} optimizer"
            ),
        },
    )
