"""One-line reasons for every choice of a working-set plan, shown by `GET /v1/jobs/{id}/plan`
and `wstrain plan spec.yaml`: what was chosen, the numbers that chose it, and overrides.

    reasons = ws_reasons(spec, dims, node, layout, window, levels, time, dev, host, ...)
"""

from __future__ import annotations

from wstrain.contracts.calibration import GIB, WRITE_BUFFER_BYTES
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import JobSpec
from wstrain.planning import cost_model as cm
from wstrain.planning import memory_model as mm
from wstrain.planning import spill as sp
from wstrain.planning.layer_time import attention_call, attention_span


def _write_buffer(spec: JobSpec, lay: mm.Layout) -> str:
    """The levels reason's note on a pinned write buffer or one other than the default."""
    size = f"; write buffer {lay.write_buffer_bytes / GIB:.3g} GiB"
    if spec.overrides.write_buffer_gib is not None:
        return size + " (override)"
    if lay.write_buffer_bytes == WRITE_BUFFER_BYTES:
        return ""
    return size + ": a whole sequence's saved set outgrows 1 GiB, and it predicted 1% faster"


def _count(levels: list[list[int]]) -> str:
    counts = [sum(row.count(lv) for row in levels) for lv in range(4)]
    return ", ".join(f"{n} at {lv}" for lv, n in enumerate(counts) if n) or "none"


def ws_reasons(
    spec: JobSpec,
    dims: ModelDims,
    node: NodeProfile,
    lay: mm.Layout,
    window: int,
    levels: list[list[int]],
    time: cm.StepTime,
    dev: int,
    host: int,
    device: str,
    bound: float,
) -> dict[str, str]:
    o, L, X = spec.overrides, dims.num_layers, lay.micro_batch
    fixed = mm.fixed_device_bytes(dims, spec, lay, window)
    per_layer = lay.units * mm.saved_bytes(dims, spec, 0, lay.seq_chunk, home=False)
    home, in_window = levels[: L - window], levels[L - window :]
    return {
        "runtime": "working_set (override)"
        if o.runtime
        else "working_set: the resident model does not fit the device budget",
        "micro_batch": f"{X} sequences per round (override)"
        if o.micro_batch
        else f"{X} sequences per round: AdaWS bound X >= {bound:.2f} (weights in "
        f"and gradients out hidden behind a layer's compute at "
        f"{node.matmul_flops / 1e12:.3g} TFLOP/s, {node.h2d_bytes_per_s / 1e9:.3g}"
        " GB/s); "
        + (
            "the fastest divisor of global_batch at or above it"
            if bound - 1e-9 <= X
            else "below it: no divisor of global_batch at or above the bound fits the budget"
        ),
        "rounds": f"{spec.global_batch // X} = global_batch {spec.global_batch} / micro_batch {X}",
        "window": (
            f"{window} (override)"
            if o.window is not None
            else f"{window} of {L} layers keep saved activations on the device: W <= (C_dev "
            f"- B) / L_bytes = ({spec.budget.device_gib:.3g} GiB - {fixed / GIB:.2f} GiB)"
            f" / {per_layer / GIB:.3f} GiB; "
            "the fastest window the cost model found"
        ),
        "device": device + (" (override)" if o.device else ""),
        "rings": f"{lay.r_param} weight slots, {lay.r_grad} gradient slots"
        + (
            " (override)"
            if o.r_param or o.r_grad
            else ""
            if lay.r_grad > 1
            else ": the deeper rings did not fit or were slower"
        ),
        "levels": f"level {o.level} asked (override): home layers {_count(home)}, window "
        f"{_count(in_window)}; lower where the host budget cannot hold it"
        if o.level is not None
        else f"home layers by the write-buffer DP, stepped down where the host budget runs "
        f"out, the least recomputation per byte first ({_count(home)}); window by spare "
        f"device memory ({_count(in_window)}); 0 = recompute the layer, 1 = keep the "
        "attention kernel's set, 2 = keep the MLP's lean set, 3 = keep both"
        + _write_buffer(spec, lay),
        "optimizer": {
            "device": "device: AdamW over streamed moments, in the next forward",
            "host": "host: CPU AdamW in a thread beside the next forward",
            "split": f"split: layers 0-{lay.device_layers - 1} and the embedding on the "
            f"device, the other {dims.num_layers - lay.device_layers} layers and the "
            "head on the host, both at once, so the host thread starts "
            f"{lay.device_layers} layers ahead of the forward that waits for it",
        }[lay.optimizer]
        + (" (override)" if o.optimizer else "")
        + (
            "; mixed precision: the fp32 master and moments live and update on the host only"
            if spec.precision == "mixed"
            else ""
        ),
        "lead_rounds": (
            f"{lay.lead_rounds}: the step's first pass carries "
            f"{lay.lead_rounds} rounds, so last step's deferred update hides "
            "behind more compute per layer"
            if lay.lead_rounds > 1
            else "1: every pass is one round"
        )
        + (" (override)" if o.lead_rounds else ""),
        "overlap": (
            f"on ({'override' if spec.overrides.overlap else 'fastest for fp8 saved sets'}): "
            "every round after the step's first pass runs its forward beside the previous "
            "round's backward, so saved sets travel during backwards too; one store on the "
            "host, each layer's sets freed as its backward ends; two rounds' transitions on "
            "the device; the first pass keeps its own levels"
            if lay.overlap
            else "off: rounds one after another (overrides.overlap=true plans the cross-round "
            "overlap; with lossless saved sets it ran slower than this on an H200)"
        ),
        "loss_tokens": f"LM-head loss in blocks of {min(lay.loss_tokens, spec.seq_len)} tokens",
        "activation_precision": "fp8: saved activations go home as float8 e4m3 with a scale "
        "per 128 elements (opt-in, lossy): half the host bytes and link traffic"
        if spec.activation_precision == "fp8"
        else "bf16: saved activations go home as they are",
        "seq_chunk": (
            f"{lay.seq_chunk}: each layer runs a sequence in {lay.pieces} pieces against a "
            f"window of its keys and values ({_window(dims, spec, lay)}), so activations on "
            "the device grow with the piece, not the sequence"
            if lay.pieces > 1
            else "0: whole sequences"
        )
        + (" (override)" if o.seq_chunk is not None else "")
        + _documents(spec, lay, node),
        "step_seconds": f"{time.total_s:.3g} s = {time.compute_s:.3g} compute + "
        f"{time.recompute_s:.3g} recompute + {time.exposed_transfer_s:.3g} "
        f"exposed transfer + {time.optimizer_s:.3g} optimizer",
        "peak_device": f"{dev / GIB:.2f} GiB <= device_gib={spec.budget.device_gib}",
        "peak_host": f"{host / GIB:.2f} GiB <= host_gib={spec.budget.host_gib}",
        "disk": _disk(spec, dims, node, lay),
    }


def _disk(spec: JobSpec, dims: ModelDims, node: NodeProfile, lay: mm.Layout) -> str:
    """Where the AdamW moments live: the host, or the last layers' in the spill file."""
    n = lay.spilled_layers
    if not n:
        return "none: all training state in host memory" + (
            f" (budget.disk_gib={spec.budget.disk_gib:g} unused: the host holds it)"
            if spec.budget.disk_gib
            else ""
        )
    read_s, write_s = sp.spill_io_seconds(dims, spec.precision, node)
    return (
        f"layers {dims.num_layers - n}-{dims.num_layers - 1}: their AdamW moments in the "
        f"spill file ({sp.disk_bytes(dims, spec.precision, n) / GIB:.2f} GiB <= "
        f"disk_gib={spec.budget.disk_gib:g}): of the spill counts that leave the host room, "
        f"the fastest; each read in {read_s:.3g} s and written back in "
        f"{write_s:.3g} s at the profiled {node.disk_read_bytes_per_s / 1e9:.3g} and "
        f"{node.disk_write_bytes_per_s / 1e9:.3g} GB/s"
        + (
            f" ({node.disk_both_bytes_per_s / 1e9:.3g} GB/s both ways in the spill's order)"
            if node.disk_both_bytes_per_s
            else ""
        )
        + " beside the host update"
    )


def _documents(spec: JobSpec, lay: mm.Layout, node: NodeProfile) -> str:
    """What the step time assumes of packed documents in pieces."""
    if not (spec.document_mask and lay.pieces > 1):
        return ""
    span = attention_span(spec.seq_len, lay, node)
    if span < spec.seq_len:
        call = attention_call(spec.seq_len, lay, node)
        return (
            f"; attention within documents, costed at {span} tokens a query (the token "
            f"file's documents, token-weighted) in calls of {call} at the profiled rate"
        )
    return "; attention within documents costed as the whole sequence's (lengths not known)"


def _window(dims: ModelDims, spec: JobSpec, lay: mm.Layout) -> str:
    """Where the pieces' window lives and what it costs there."""
    if lay.window_home:
        return (
            f"{mm.host_window_bytes(dims, spec, lay) / GIB:.2f} GiB with their gradient sums "
            f"in host memory, {mm.context_window_bytes(dims, spec, lay) / GIB:.2f} GiB of key "
            "blocks staged on the device (overrides.window_home)"
        )
    return f"{mm.context_window_bytes(dims, spec, lay) / GIB:.2f} GiB with their gradient sums"
