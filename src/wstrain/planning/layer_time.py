"""A decoder layer's time, as every planner prices it: one sequence's forward and backward
through a layer (measured on the node or from FLOPs at its profiled rates) and through the
LM head and its loss, the share of a forward each saved-activation level recomputes, the
span and kernel-call length of a long sequence's attention, and AdaWS's smallest
micro-batch that hides a layer's weight traffic. The resident planner
(planning/resident.py) and the working-set cost model (planning/cost_model.py) both read it.

    fwd_s, bwd_s = chunk_times(dims, spec.seq_len, node)
"""

from __future__ import annotations

from wstrain.contracts.calibration import (
    ATTENTION_BACKWARD_RATIO,
    ATTENTION_OVERHEAD,
    MLP_RECOMPUTED_SHARE,
    RUNTIME_OVERHEAD,
)
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.planning.memory_model import Layout


def adaws_min_micro_batch(
    psi_total: int,
    psi_active: int,
    seq_len: int,
    d_attn: int,
    param_bytes: int,
    grad_bytes: int,
    flops: float,
    link_bytes_per_s: float,
) -> float:
    """AdaWS §3.2.2: X >= (|τp|+|τg|)·ψ_total·P / (2·S·(ψ_active + S·d_attn)·BW), so a
    layer's forward outlasts streaming its weights in and its gradients out."""
    return (
        (param_bytes + grad_bytes)
        * psi_total
        * flops
        / (2 * seq_len * (psi_active + seq_len * d_attn) * link_bytes_per_s)
    )


def attention_span(seq_len: int, lay: Layout | None, node: NodeProfile) -> int:
    """Tokens a query's causal attention spans, as the runtime runs it: a long sequence's
    pieces over packed documents attend within each document (node.document_span), a
    whole sequence under document_mask through a dense mask over all of it."""
    span = node.document_span
    return span if lay is not None and lay.seq_chunk and 0 < span < seq_len else seq_len


def attention_call(seq_len: int, lay: Layout | None, node: NodeProfile) -> int:
    """Tokens of one attention kernel call where packed documents run in pieces: a
    document's part of a piece, at most min(piece, document) queries and as many keys in
    each of its prefix and diagonal calls (ops/document_attn.py), so it runs at the profiled
    rate that long (128K of 8K documents in 4K pieces on an H100: 14% under the measured
    step at the 8K rate, 7% under at the 4K one; bench/RESULTS.md). 0 elsewhere: the span's
    rate (a plain piece's prefix call takes the whole prefix's keys)."""
    span = attention_span(seq_len, lay, node)
    return min(span, lay.seq_chunk) if lay is not None and span < seq_len else 0


def core_attention_s(
    dims: ModelDims, seq_len: int, span: int, node: NodeProfile, call: int = 0
) -> float:
    """Causal attention forward of one sequence whose queries span `span` tokens (their
    documents'), in the runtime at the profiled rate of `call` tokens (attention_call; 0:
    `span`): a profiled rate counts the backward as two forwards where the kernels take
    2.5; a node without attention points has the matmul rate, a forward's own."""
    flops = 2 * seq_len * span * dims.num_heads * dims.head_dim
    timed = 3 / (1 + ATTENTION_BACKWARD_RATIO) if node.attention_points else 1.0
    return ATTENTION_OVERHEAD * timed * flops / node.attention_flops(call or span)


def recompute_shares(
    dims: ModelDims, seq_len: int, node: NodeProfile, span: int = 0, call: int = 0
) -> tuple[float, ...]:
    """Share of a layer's forward each level recomputes in backward: 0 the attention block
    and the MLP's gate/up, 1 the output projection (with q/k norms also the QKV projections)
    and gate/up, 2 the attention block, 3 the output projection. The blocks' times are
    measured where the node carries them; the split inside attention is by FLOPs at the
    profiled GEMM and attention rates. `span`, `call`: attention_span (0: the whole
    sequence) and attention_call."""
    S, D, hd = seq_len, dims.hidden_size, dims.head_dim
    span = span or S
    qkv_s = 2 * S * D * (dims.num_heads + 2 * dims.num_kv_heads) * hd / node.matmul_flops
    o_s = 2 * S * D * dims.num_heads * hd / node.matmul_flops
    core_s = core_attention_s(dims, S, span, node, call)
    attn_s = qkv_s + o_s + core_s
    mlp_s = max(0.0, 2 * S * dims.layer_params_active / node.matmul_flops - qkv_s - o_s)
    lt = node.layer
    if lt is not None and lt.seq_len == seq_len and span == S:
        attn_s, mlp_s = lt.attention_forward_s, lt.mlp_forward_s
    o_share = (o_s + (qkv_s if dims.qk_norm else 0.0)) / (qkv_s + o_s + core_s)
    fwd_s, up_s = attn_s + mlp_s, MLP_RECOMPUTED_SHARE * mlp_s
    return (
        (attn_s + up_s) / fwd_s,
        (o_share * attn_s + up_s) / fwd_s,
        attn_s / fwd_s,
        o_share * attn_s / fwd_s,
    )


def chunk_times(
    dims: ModelDims, seq_len: int, node: NodeProfile, span: int = 0, call: int = 0
) -> tuple[float, float]:
    """(forward, backward) seconds of one sequence through one decoder layer: measured when
    the node carries the job's layer times, else from FLOPs at the profiled rates. From
    FLOPs, the GEMMs carry RUNTIME_OVERHEAD (hooks, launch gaps, elementwise work) and the
    attention its own, ATTENTION_OVERHEAD (a piece's launches and merges; core_attention_s),
    each fitted on the rows where it dominates. `span`, `call`: attention_span (0: the
    whole sequence) and attention_call."""
    k = RUNTIME_OVERHEAD
    span = span or seq_len
    if node.layer is not None and node.layer.seq_len == seq_len and span == seq_len:
        return k * node.layer.forward_s, k * node.layer.backward_s
    gemm = 2 * seq_len * dims.layer_params_active / node.matmul_flops  # MoE: Ψ_active
    attn_s = core_attention_s(dims, seq_len, span, node, call)
    return k * gemm + attn_s, k * 2 * gemm + ATTENTION_BACKWARD_RATIO * attn_s


def head_and_loss_s(dims: ModelDims, seq_len: int, node: NodeProfile) -> float:
    """One sequence through the LM head forward and backward (its GEMMs at the matmul rate)
    and the loss over its logits (fp32 cross-entropy, memory-bound, at the profile's
    loss_logits_per_s; 0 where the node did not measure it)."""
    head_s = 6 * seq_len * dims.embedding_params / node.matmul_flops
    if not node.loss_logits_per_s:
        return head_s
    return head_s + seq_len * dims.vocab_size / node.loss_logits_per_s
