"""Plans for the working-set runtime: pick micro-batch, window and ring sizes that fit the
device budget, with a memory model calibrated on an H200 run of bench/runtime.py
(Llama-3-8B dims, 16 layers, 8K tokens: predicted within a few percent of the allocator's
reserved peak). The autoconfigurator issue replaces the search and the levels with AdaWS's
bound and DP; the memory terms stay.

    plan = make_ws_plan(spec, dims, node)     # InfeasibleBudget if nothing fits
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.contracts import GIB, JobSpec, MinBudget, Plan, Predicted, WorkingSetPlan
from scheduler.errors import InfeasibleBudget, InvalidSpec
from scheduler import levels as level_rules
from scheduler.model_dims import ModelDims
from scheduler.planner import (ALLOCATOR_SLACK, ELEMENT_BYTES, NodeProfile,
                               activation_bytes_per_token)

# Fraction of a layer's full saved set kept per level (0 inputs only, 1 attention graph,
# 2 the MLP's lean set, 3 both), for a uniform level override.
LEVEL_FRACTION = (0.0, 0.35, 0.33, 0.68)
DEVICE_RESERVE_BYTES = GIB // 2
# Interpreter, torch, CUDA context and runtime libraries next to the arena (measured 5.2 GiB
# on the H200 host; a CPU worker needs far less).
PROCESS_BYTES = {"cuda": int(5.5 * GIB), "cpu": int(0.75 * GIB)}
MAX_MICRO_BATCH = 8
WINDOW_MARGIN = 1.3
WRITE_BUFFER_BYTES = GIB  # worker/saved_acts.py's default bound on copies in flight home


@dataclass(frozen=True)
class WsChoice:
    micro_batch: int
    window: int
    r_param: int
    r_grad: int
    level: int
    device_optimizer: bool = False  # two moment slots each for m and v on the device
    loss_tokens: int = 2048  # LM-head token block


def device_bytes(dims: ModelDims, spec: JobSpec, c: WsChoice) -> int:
    e = ELEMENT_BYTES[spec.precision]
    S, D = spec.seq_len, dims.hidden_size
    groups = 4 * dims.embedding_params * e + 2 * D * e  # embedding + head, weights + grads
    rings = (c.r_param + c.r_grad + 4 * c.device_optimizer) * dims.layer_params * e
    transition = c.micro_batch * S * D * e
    # LM-head block: logits + their fp32 copy + fp32 grad
    loss = min(c.loss_tokens, spec.seq_len) * dims.vocab_size * (e + 8)
    per_token = activation_bytes_per_token(dims, spec.precision)
    workspace = int(1.3 * per_token * S)  # one sequence's layer fwd+bwd while recomputing
    window = c.window * c.micro_batch * S * (D * e + LEVEL_FRACTION[c.level] * per_token)
    # copies in flight home: bounded by the write buffer, and by all a round sends home
    sent = (dims.num_layers - c.window) * c.micro_batch * S * (D * e + LEVEL_FRACTION[c.level]
                                                               * per_token)
    home = min(WRITE_BUFFER_BYTES, int(sent))
    total = groups + rings + transition + loss + workspace + window + home + DEVICE_RESERVE_BYTES
    return int(total * ALLOCATOR_SLACK)


def host_bytes(dims: ModelDims, spec: JobSpec, c: WsChoice, device: str) -> int:
    e = ELEMENT_BYTES[spec.precision]
    state = 4 * e * (dims.num_layers * dims.layer_params + 2 * dims.embedding_params)
    per_token = activation_bytes_per_token(dims, spec.precision)
    home = ((dims.num_layers - c.window) * c.micro_batch * spec.seq_len
            * (dims.hidden_size * e + LEVEL_FRACTION[c.level] * per_token))
    return int(state + home) + PROCESS_BYTES[device]


def _candidates(spec: JobSpec, dims: ModelDims) -> list[WsChoice]:
    o = spec.overrides
    mbs = [o.micro_batch] if o.micro_batch else [
        m for m in range(min(MAX_MICRO_BATCH, spec.global_batch), 0, -1)
        if spec.global_batch % m == 0]
    windows = [o.window] if o.window is not None else list(range(dims.num_layers, -1, -1))
    rings = [(o.r_param or 3, o.r_grad or 2)] if (o.r_param or o.r_grad) else [(3, 2), (2, 1)]
    level = o.level or 0
    # Device optimizer first (the CPU one costs seconds a step on the critical path), then
    # rings before window: a single gradient slot stalls every later round (both measured).
    # A smaller LM-head block costs little time and frees memory for a larger micro-batch.
    return [WsChoice(m, min(w, dims.num_layers), rp, rg, level, dev_opt, lt)
            for m in mbs for dev_opt in (True, False) for rp, rg in rings
            for lt in (2048, 1024, 512) for w in windows]


def make_ws_plan(spec: JobSpec, dims: ModelDims, node: NodeProfile) -> Plan:
    if spec.precision == "mixed":
        raise InvalidSpec('precision="mixed" runs only on the resident runtime; the working '
                          'set keeps pure bf16 or fp32 state: use precision "bf16"')
    device = spec.overrides.device or node.device
    if spec.overrides.micro_batch and spec.global_batch % spec.overrides.micro_batch:
        raise InvalidSpec(f"overrides.micro_batch={spec.overrides.micro_batch} must divide "
                          f"global_batch={spec.global_batch}")
    # Largest micro-batch first (fewer weight passes per step), then the widest window.
    for c in _candidates(spec, dims):
        dev, host = device_bytes(dims, spec, c), host_bytes(dims, spec, c, device)
        if dev <= spec.budget.device_bytes and host <= spec.budget.host_bytes:
            return _plan(spec, dims, node, c, dev, host, device)
    smallest = WsChoice(1, 0, 2, 1, 0, False, 512)
    need = MinBudget(device_gib=round(device_bytes(dims, spec, smallest) / GIB + 0.005, 2),
                     host_gib=round(host_bytes(dims, spec, smallest, device) / GIB + 0.005, 2))
    raise InfeasibleBudget(
        f"budget device_gib={spec.budget.device_gib}, host_gib={spec.budget.host_gib} cannot "
        f"hold {dims.params / 1e6:.1f}M parameters at seq_len={spec.seq_len} even with the "
        f"working-set runtime; raise the budget to at least device_gib={need.device_gib}, "
        f"host_gib={need.host_gib}", min_budget=need.model_dump())


def _levels(spec: JobSpec, dims: ModelDims, node: NodeProfile, c: WsChoice, dev: int,
            host: int) -> level_rules.Levels:
    if spec.overrides.level is not None:
        return level_rules.uniform(dims, c.micro_batch, c.level)
    # Spare device memory is counted against 1.3x the prediction: at 40 GiB the reserved peak
    # ran 27% over it (bench/RESULTS.md), and a budget is a contract.
    spare_dev = int((spec.budget.device_bytes - WINDOW_MARGIN * dev) / ALLOCATOR_SLACK)
    # The device optimizer sends weights and both moments of every layer home in round 0's
    # forward: the link carries that before any activation.
    optimizer_home = (3 * dims.layer_params * ELEMENT_BYTES[spec.precision]
                      if c.device_optimizer else 0)
    return level_rules.assign(dims, spec, ELEMENT_BYTES[spec.precision], c.micro_batch,
                              c.window, node.d2h_bytes_per_s, node.matmul_flops,
                              max(0, spare_dev), max(0, spec.budget.host_bytes - host),
                              optimizer_home)


def _plan(spec: JobSpec, dims: ModelDims, node: NodeProfile, c: WsChoice, dev: int,
          host: int, device: str) -> Plan:
    L = dims.num_layers
    rounds = spec.global_batch // c.micro_batch
    lv = _levels(spec, dims, node, c, dev, host)
    dev += int(lv.device_bytes * ALLOCATOR_SLACK)
    host += lv.host_bytes
    tokens = spec.global_batch * spec.seq_len
    # fwd+bwd is three layer forwards; recompute adds lv.recompute_forwards per round
    recompute = 1.0 + lv.recompute_forwards / (3.0 * L * c.micro_batch)
    compute_s = dims.flops_per_token(spec.seq_len) * tokens * recompute / node.matmul_flops
    # The device optimizer hides behind the next forward only on a GPU; on a CPU node the
    # "device" is the CPU and the update is as exposed as the host one.
    hidden = c.device_optimizer and device == "cuda"
    optimizer_s = 0.0 if hidden else dims.params / node.optimizer_params_per_s
    n2 = sum(row.count(2) for row in lv.levels)
    return Plan(
        runtime="working_set", device=device, micro_batch=c.micro_batch, rounds=rounds,
        window=c.window, layers=L, params=dims.params,
        predicted=Predicted(step_seconds=compute_s + optimizer_s, peak_device_bytes=dev,
                            peak_host_bytes=host),
        working_set=WorkingSetPlan(chunk=1, r_param=c.r_param, r_grad=c.r_grad,
                                   levels=lv.levels,
                                   loss_tokens=min(c.loss_tokens, spec.seq_len),
                                   optimizer="device" if c.device_optimizer else "host"),
        reasons={
            "runtime": "working_set: the resident model does not fit the device budget"
                       if not spec.overrides.runtime else "working_set (override)",
            "micro_batch": f"{c.micro_batch} sequences per round: the largest divisor of "
                           f"global_batch <= {MAX_MICRO_BATCH} that fits (weights stream once "
                           "per round)",
            "rounds": f"{rounds} = global_batch {spec.global_batch} / micro_batch {c.micro_batch}",
            "window": f"last {c.window} of {L} layers keep saved activations on the device; "
                      "the rest send them home",
            "device": f"{device}", "r_param": f"{c.r_param} weight slots",
            "levels": (f"level {c.level} everywhere (override)" if spec.overrides.level
                       is not None else f"{n2} of {L * c.micro_batch} (layer, chunk) pairs "
                       "keep the MLP's lean set (level 2): as many as the D2H link carries "
                       "during each home layer's forward and spare device memory holds in the "
                       "window; the rest recompute the layer (level 0)"),
            "optimizer": "device: AdamW over streamed moments, hidden in the next forward"
                         if c.device_optimizer else "host: CPU AdamW after backward (the "
                         "device optimizer's four moment slots do not fit)",
            "step_seconds": f"{compute_s:.3g} s compute (x{recompute:.2f} recompute) at "
                            f"{node.matmul_flops / 1e12:.3g} TFLOP/s + {optimizer_s:.3g} s "
                            "exposed optimizer",
            "peak_device": f"{dev / GIB:.2f} GiB <= device_gib={spec.budget.device_gib}",
            "peak_host": f"{host / GIB:.2f} GiB <= host_gib={spec.budget.host_gib}",
        })
