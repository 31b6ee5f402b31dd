"""The working-set cost model's time: for one candidate layout, the step time with its
breakdown (compute, recompute, exposed transfer, exposed optimizer), from the model's
dimensions and the node's measured profile (contracts/hardware.py); the bytes a
layout holds are memory_model.py's, one layer's compute layer_time.py's.

Time terms follow AdaWS §3.2: a layer's forward takes 2·S·(ψ_active + S·d_attn)/P (what a
token computes with), its weights ψ_total (what crosses PCIe); its backward twice that
(flash attention 2.5x), recomputation adds a share of a forward per (layer, chunk) by
saved-activation level, and weights, gradients and saved sets crossing PCIe are exposed only
where they outlast the compute they overlap; last step's deferred AdamW delays this step's
first forward (optimizer_s).

    cost = step_time(dims, spec, layout, levels, window, node)   # StepTime
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from wstrain.contracts.calibration import (
    ATTENTION_BACKWARD_RATIO,
    ATTENTION_KEY_BLOCK_TOKENS,
    ELEMENT_BYTES,
    LEVELS,
    LINK_SHARE,
    MIXED_UPDATE_SLOWDOWN,
    MLP_BACKWARD_SHARE,
    PAIRED_LINK_SHARE,
    PIECE_SUMS_BYTES_PER_S,
)
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import JobSpec
from wstrain.contracts.step_shape import piece_spans
from wstrain.planning.layer_time import (
    attention_call,
    attention_span,
    chunk_times,
    core_attention_s,
    head_and_loss_s,
    recompute_shares,
)
from wstrain.planning.levels import LayerCost, write_buffer_stall_s
from wstrain.planning.memory_model import (
    Layout,
    saved_bytes_by_level,
)
from wstrain.planning.spill import SpillIO, spill_io_seconds, spilled_update_ends


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    recompute_s: float
    exposed_transfer_s: float
    optimizer_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.recompute_s + self.exposed_transfer_s + self.optimizer_s


# ------------------------------------------------------------------ time


def piece_sums_s(dims: ModelDims, seq_len: int, lay: Layout, span: int) -> float:
    """Seconds one sequence's backward through one layer adds its pieces' attention
    gradients into fp32 sums (worker/ops/prefix_attn.py): a piece [s0, s1) adds dK and dV of
    its keys (a bf16 read, an fp32 read and write: 20 bytes a K/V channel of a key) and dQ
    of each key block's call (10 bytes a query channel); packed documents' pieces add their
    documents' keys only. 0 for whole sequences."""
    if lay.pieces == 1:
        return 0.0
    kv, q = dims.num_kv_heads * dims.head_dim, dims.num_heads * dims.head_dim
    total = 0
    for s0, s1 in piece_spans(seq_len, lay.seq_chunk):
        keys = s1 if span >= seq_len else min(s1, s1 - s0 + span)
        calls = 1 + -(-(keys - (s1 - s0)) // ATTENTION_KEY_BLOCK_TOKENS)
        total += 20 * keys * kv + 10 * calls * (s1 - s0) * q
    return total / PIECE_SUMS_BYTES_PER_S


def window_stream_s(dims: ModelDims, spec: JobSpec, lay: Layout, node: NodeProfile) -> float:
    """Seconds a window kept on the host (Layout.window_home, worker/ops/host_window.py)
    adds to one sequence's pass through one layer: each piece's K and V go home on the
    compute stream twice (the forward, the backward's rebuild); a call's first key block
    comes in before its kernels (the forward's prefix; the backward's, with its fp32 sums),
    the rest while the block before computes, showing only where a piece's copies outlast
    its attention (backward: 2.5x the forward's). 0 with the window on the device."""
    if not lay.window_home or lay.pieces == 1:
        return 0.0
    S, block = spec.seq_len, ATTENTION_KEY_BLOCK_TOKENS
    width = dims.num_kv_heads * dims.head_dim
    kv_b, sums_b = 2 * width * ELEMENT_BYTES[spec.precision], 2 * width * 4  # a key's
    core_s = core_attention_s(dims, S, S, node, attention_call(S, lay, node))
    total = 2 * S * kv_b / node.d2h_bytes_per_s
    for s0, s1 in piece_spans(S, lay.seq_chunk):
        fwd_s = core_s * (s1 * s1 - s0 * s0) / (S * S)
        first_in_s = min(s0, block) * kv_b / node.h2d_bytes_per_s
        total += first_in_s + max(0.0, s0 * kv_b / node.h2d_bytes_per_s - first_in_s - fwd_s)
        first_in_s = min(s1, block) * (kv_b + sums_b) / node.h2d_bytes_per_s
        both_s = (s1 * (kv_b + sums_b) + s0 * sums_b) / node.both_bytes_per_s
        total += first_in_s + max(0.0, both_s - first_in_s - ATTENTION_BACKWARD_RATIO * fwd_s)
    return total


def layer_cost(dims: ModelDims, spec: JobSpec, lay: Layout, node: NodeProfile) -> LayerCost:
    """One home layer as the levels DP sees it (planning/levels.py), per round."""
    span, call = attention_span(spec.seq_len, lay, node), attention_call(spec.seq_len, lay, node)
    fwd_s, bwd_s = chunk_times(dims, spec.seq_len, node, span, call)
    fwd_s /= lay.pieces  # a piece's share (causal attention: the same total as whole)
    saved = saved_bytes_by_level(dims, spec, lay.seq_chunk)
    weights = dims.layer_params * ELEMENT_BYTES[spec.precision]
    # with overlap (a pass after the step's first): each forward chunk runs beside a chunk of
    # the previous pass's backward, whose sets the link drains in too, less that backward's
    # weight gradients going home; inbound also brings the forward's weights, during both.
    # Everything coming in then shares the link with the forward's sets going out: it
    # comes in at the planned share of the two-way rate, as they go out (at the one-way
    # rate the H200's overlap rows stalled 0.9-2.7 s a step where 0.13-0.65 s was planned,
    # bench/RESULTS.md)
    paired = lay.overlap and lay.pieces == 1
    two_way_bytes_per_s = (PAIRED_LINK_SHARE if paired else LINK_SHARE) * node.both_bytes_per_s
    inbound_bytes_per_s = two_way_bytes_per_s if paired else node.h2d_bytes_per_s
    weights_in_bytes_per_s = two_way_bytes_per_s if paired else node.both_bytes_per_s
    return LayerCost(
        chunks=lay.units,
        compute_s=fwd_s,
        transfer_s=tuple(b / two_way_bytes_per_s for b in saved),
        value_s=tuple(
            fwd_s * (1.0 - r) for r in recompute_shares(dims, spec.seq_len, node, span, call)
        ),
        cap_s=link_seconds(lay.write_buffer_bytes, node),
        back_s=tuple(b / inbound_bytes_per_s for b in saved),
        prefetch_cap_s=lay.write_buffer_bytes / inbound_bytes_per_s,
        inbound_s=(2 + paired) * weights / weights_in_bytes_per_s,
        busy_s=lay.micro_batch * (bwd_s + paired * fwd_s),
        unit_value_s=piece_values(dims, spec, lay, node),
        drain_s=paired * max(0.0, bwd_s - link_seconds(weights, node) / lay.units),
    )


def piece_values(
    dims: ModelDims, spec: JobSpec, lay: Layout, node: NodeProfile
) -> tuple[tuple[float, ...], ...]:
    """Per (chunk, piece) unit and level, the value beyond a piece's average of keeping its
    attention output (levels 1 and 3): a piece [s0, s1) of a causal sequence S long costs
    (s1² - s0²) / S² of its attention forward, not 1/pieces. () for whole sequences, and for
    packed documents, whose attention stays within each document wherever the piece sits."""
    S = spec.seq_len
    if lay.pieces == 1 or attention_span(S, lay, node) < S:
        return ()
    core_s = core_attention_s(dims, S, S, node)
    rows = []
    for s0, s1 in piece_spans(S, lay.seq_chunk):
        extra = core_s * ((s1 * s1 - s0 * s0) / (S * S) - 1 / lay.pieces)
        rows.append(tuple(extra if lv in (1, 3) else 0.0 for lv in range(LEVELS)))
    return tuple(rows) * lay.micro_batch  # units: a chunk's pieces, chunk after chunk


def step_time(
    dims: ModelDims,
    spec: JobSpec,
    lay: Layout,
    levels: list[list[int]],
    window: int,
    node: NodeProfile,
    device: str,
    first_levels: list[list[int]] | None = None,
) -> StepTime:
    """Step time of a plan; `levels=[]` gives the part that does not depend on levels.
    `first_levels`: the step's first pass's, where they differ (with overlap)."""
    L, X, S = dims.num_layers, lay.micro_batch, spec.seq_len
    e = ELEMENT_BYTES[spec.precision]
    rounds = spec.global_batch // X
    fwd_s, bwd_s = chunk_times(
        dims, S, node, attention_span(S, lay, node), attention_call(S, lay, node)
    )
    head_s = head_and_loss_s(dims, S, node)
    # long context: backward first puts each layer's K and V back in the window from the
    # inputs (the norm and the K/V projections again)
    rebuild_s = (lay.pieces > 1) * 4 * S * dims.hidden_size * dims.num_kv_heads * dims.head_dim
    sums_s = piece_sums_s(dims, S, lay, attention_span(S, lay, node))
    sums_s += window_stream_s(dims, spec, lay, node)
    compute = rounds * X * (L * (fwd_s + bwd_s + rebuild_s / node.matmul_flops + sums_s) + head_s)
    weights = dims.layer_params * e
    # forward: the next layer's weights must arrive while this one computes
    exposed = L * max(0.0, weights / node.h2d_bytes_per_s - X * fwd_s)
    # Each layer's gradients going home show once a step (measured: one transfer per layer
    # on the H200). With one gradient slot, every later round also sends k home and fetches
    # k-1's accumulated gradients in series, overlapped with the first chunk's MLP backward
    # (the slot is taken at the layer's first accumulate).
    grads_s = L * weights / node.d2h_bytes_per_s
    if lay.r_grad == 1:
        in_series = weights / node.d2h_bytes_per_s + weights / node.h2d_bytes_per_s
        grads_s += (rounds - 1) * L * max(0.0, in_series - MLP_BACKWARD_SHARE * bwd_s)
    first = first_levels or levels
    if lay.overlap:  # the first pass alone, the later ones each beside a backward
        lead = lay.lead_rounds
        alone = layer_cost(dims, spec, replace(lay, overlap=False), node)
        rec_f, exp_f = _round_cost(alone, first, window)
        rec_l, exp_l = _round_cost(layer_cost(dims, spec, lay, node), levels, window)
        recompute = lead * rec_f + (rounds - lead) * rec_l
        exposed = rounds * exposed + lead * exp_f + (rounds - lead) * exp_l
    else:
        rec, exp = _round_cost(layer_cost(dims, spec, lay, node), levels, window)
        recompute, exposed = rounds * rec, rounds * (exposed + exp)
    sent = first_forward_sent(dims, spec, lay, first[: L - window])
    optimizer = optimizer_s(dims, spec, lay, sent, node, device)
    return StepTime(compute, recompute, exposed + grads_s, optimizer)


def _round_cost(lc: LayerCost, levels: list[list[int]], window: int) -> tuple[float, float]:
    """(recomputation, exposed transfer) of one round at `levels` ([layer][unit], the last
    `window` layers on the device)."""
    L = len(levels)
    home, in_window = levels[: L - window], levels[L - window :]
    recompute = exposed = 0.0
    if home:
        rec, exp = lc.row_costs(np.asarray(home))
        recompute, exposed = float(rec.sum()), float(exp.sum())
    for row in in_window:
        rec_w = sum(lc.compute_s - lc.value_of(c, lv) for c, lv in enumerate(row))
        recompute += rec_w
        exposed += float(lc.inbound_exposed(rec_w))
    # hand-made levels may overrun the link: compute waits on the write buffer
    exposed += write_buffer_stall_s([lc] * len(home), home)
    return recompute, exposed


def first_forward_sent(
    dims: ModelDims, spec: JobSpec, lay: Layout, home: list[list[int]]
) -> list[int]:
    """Saved bytes each layer sends home in the step's first pass (its lead rounds' worth;
    the window's layers, after the home ones, send none)."""
    per_level = saved_bytes_by_level(dims, spec, lay.seq_chunk)
    sent = [lay.lead_rounds * sum(per_level[lv] for lv in row) for row in home]
    return sent + [0] * (dims.num_layers - len(home))


def optimizer_s(
    dims: ModelDims, spec: JobSpec, lay: Layout, sent: list[int], node: NodeProfile, device: str
) -> float:
    """What last step's deferred AdamW adds to this step (working_set/schedule.py). The device
    part: layer k's gradient and moments come in and its weights and moments go home while
    its first forward computes, beside the saved sets `sent[k]` it sends home; the embedding
    (and head, if all is on the device) update right after backward with their moments
    streamed. A split layout with no device_layers yet takes the best split for `sent`.
    Spilled layers (the last lay.spilled_layers) update at the disk's pace (planning/spill.py)."""
    if lay.optimizer == "split":
        times = _split_times(dims, spec, lay, sent, node, device)
        return times[lay.device_layers - 1] if lay.device_layers else min(times)
    layer_fwd_s, device_s, staged_s = _device_parts(dims, spec, lay, sent, node)
    rate = _host_rate(spec, node)
    io = _spill_io(dims, spec, lay, node)
    if device != "cuda":  # a CPU worker's "device" is the host: nothing to load
        return _deferred_s(dims, layer_fwd_s, rate, [], 0.0, 0.0, io)
    load_s = _load_s(dims, spec, node)
    if lay.optimizer == "host":
        return _deferred_s(dims, layer_fwd_s, rate, [], 0.0, load_s, io)
    return _deferred_s(dims, layer_fwd_s, rate, device_s, 2 * staged_s, load_s, io)


def split_layers(
    dims: ModelDims, spec: JobSpec, lay: Layout, sent: list[int], node: NodeProfile, device: str
) -> int:
    """The number of leading layers a split layout updates on the device, fastest first
    (never a spilled layer: the host updates those)."""
    times = _split_times(dims, spec, lay, sent, node, device)
    return 1 + times.index(min(times))


def _load_s(dims: ModelDims, spec: JobSpec, node: NodeProfile) -> float:
    """One layer's weights over the host-to-device link."""
    return dims.layer_params * ELEMENT_BYTES[spec.precision] / node.h2d_bytes_per_s


def _host_rate(spec: JobSpec, node: NodeProfile) -> float:
    """The host AdamW's parameters a second for this job's precision."""
    if spec.precision == "mixed":  # the profile times bf16 state
        return node.optimizer_params_per_s / MIXED_UPDATE_SLOWDOWN
    return node.optimizer_params_per_s


def _spill_io(dims: ModelDims, spec: JobSpec, lay: Layout, node: NodeProfile) -> SpillIO:
    """(spilled layers, one's read seconds, its write seconds); (0, 0, 0) without spill."""
    if not lay.spilled_layers:
        return (0, 0.0, 0.0)
    return (lay.spilled_layers, *spill_io_seconds(dims, spec.precision, node))


def _split_times(
    dims: ModelDims, spec: JobSpec, lay: Layout, sent: list[int], node: NodeProfile, device: str
) -> list[float]:
    """optimizer_s of a split with 1, 2, ... L-1 device layers (the embedding on the device,
    the head on the host), at most up to the first spilled layer."""
    layer_fwd_s, device_s, staged_s = _device_parts(dims, spec, lay, sent, node)
    rate, io = _host_rate(spec, node), _spill_io(dims, spec, lay, node)
    most = min(dims.num_layers - 1, dims.num_layers - lay.spilled_layers)
    if device != "cuda":  # a CPU worker's "device" is the host
        return [_deferred_s(dims, layer_fwd_s, rate, [], 0.0, 0.0, io)] * most
    load_s = _load_s(dims, spec, node)
    return [
        _deferred_s(dims, layer_fwd_s, rate, device_s[:k], staged_s, load_s, io)
        for k in range(1, most + 1)
    ]


def _device_parts(
    dims: ModelDims, spec: JobSpec, lay: Layout, sent: list[int], node: NodeProfile
) -> tuple[float, list[float], float]:
    """(one layer's first-pass forward, each layer's exposure if the device updates it, the
    staged update of one resident group)."""
    span, call = attention_span(spec.seq_len, lay, node), attention_call(spec.seq_len, lay, node)
    one_s = chunk_times(dims, spec.seq_len, node, span, call)[0]
    layer_fwd_s = lay.lead_rounds * lay.micro_batch * one_s
    e = ELEMENT_BYTES[spec.precision]
    weights = dims.layer_params * e
    # the saved sets at the link share planned for them (measured at 32 layers: ~23 ms a
    # device layer exposed where the whole link would give 15)
    device_s = [
        max(0.0, 3 * weights / node.both_bytes_per_s + link_seconds(b, node) - layer_fwd_s)
        for b in sent
    ]
    load_s = _load_s(dims, spec, node)
    if lay.r_grad == 1:  # each layer's gradient for its update loads only once the
        # previous layer's slot is free: no prefetch (measured: OLMoE at 20 GiB, +0.5 s)
        device_s = [s + load_s for s in device_s]
    if device_s:  # the first layer's weights, gradient and moments load with no forward
        # before it to hide under (an H200, 4 layers: 32-42 ms idle at the step's start);
        # with one gradient slot its gradient's load is counted above already
        device_s[0] += (3 if lay.r_grad == 1 else 4) * load_s
    staged_s = dims.embedding_params * 4 * e / node.both_bytes_per_s  # in: m, v; out: w, m, v
    return layer_fwd_s, device_s, staged_s


def _deferred_s(
    dims: ModelDims,
    layer_fwd_s: float,
    params_per_s: float,
    device_s: list[float],
    staged_s: float,
    load_s: float,
    spill: SpillIO = (0, 0.0, 0.0),
) -> float:
    """The first forward's delay (`layer_fwd_s` a layer): the device updates the first
    len(device_s) layers as they arrive (each exposing device_s[k]), after `staged_s` for its
    resident groups; a host thread at `params_per_s` updates the others (starting with the
    embedding when it has them all) and the head last, and layer k's forward waits for
    layer k's update and then its weights' load (`load_s`: the ring cannot fetch a layer
    before the host has updated it; on an H200 at 8 layers 16 ms of the step's idle start
    that the updates alone leave out). `spill`: the last spill[0] layers' moments come from
    and go back to disk (spill[1], spill[2] seconds a layer), so their updates end at the
    disk's pace."""
    L, k = dims.num_layers, len(device_s)
    count, read_s, write_s = spill
    layer_s = dims.layer_params / params_per_s
    embed_s = dims.embedding_params / params_per_s
    updated = forward_end = embed_s if k == 0 else 0.0  # the host thread's clock
    forward_end = max(forward_end, staged_s)  # nothing computes before the embedding
    spilled_ends: list[float] = []
    for j in range(L):
        if j < k:
            forward_end += device_s[j] + layer_fwd_s
            continue
        if j == L - count:  # the first spilled layer: the disk's timeline from here
            spilled_ends = spilled_update_ends(updated, count, layer_s, read_s, write_s)
        updated = spilled_ends[j - (L - count)] if j >= L - count else updated + layer_s
        forward_end = max(forward_end, updated + load_s) + layer_fwd_s
    head_ready = forward_end if k == L else max(forward_end, updated + embed_s)
    return head_ready - L * layer_fwd_s


def link_seconds(nbytes: int, node: NodeProfile) -> float:
    """Time a saved set takes home at the share of the link planned for activations."""
    return nbytes / (LINK_SHARE * node.both_bytes_per_s)
