"""Long sequences through the two places that grow with S²·heads or S·V: causal attention,
a chunk of queries at a time, and the LM head fused with cross entropy, a chunk of tokens at a
time. Each is an autograd.Function that saves its inputs and a log-sum-exp a row, and
recomputes one chunk at a time in backward; values and gradients are dense.causal_attention's
(under document_mask) and F.cross_entropy's over the whole logits. Pure torch, fp32 math.

    out = chunked_causal_attention(q, k, v, chunk=1024, segments=seg)    # (B, H, S, hd)
    out, lse = chunked_attention_lse(q, k, v, 1024, seg)                 # lse (B, H, S) fp32
    o, lse = merge_partials(o1, lse1, o2, lse2)    # two attentions over disjoint key sets
    o, lse = block_attention_forward(q, k_block, v_block, causal)  # one block of keys
    loss_sum = chunked_lm_loss(h, w_head, labels, chunk=4096)            # 0-d fp32
    (loss_sum / data.target_tokens(step, sequences)).backward()

Attention. At 512K tokens one head's fp32 scores are 1 TiB, a chunk of 1024 queries' 2 GiB
a head (this is the reference: the device runs each part through a flash kernel).

q: (B, H, S, hd); k, v: (B, KV, S, hd) with H a multiple of KV (query head h reads kv head
h // (H/KV), as SDPA's enable_gqa); segments: (B, S) each token's document (dense.py's
document_mask): attention never crosses a document.

Query chunk [s0, s1) attends to keys [0, s1) in two parts: the prefix [lo, s0), with no
causal mask (every prefix key precedes every query; lo > 0 where no query's document reaches
further back), and the diagonal block [s0, s1) with the causal mask of the block itself. Each
part gives an output o_i normalised over its own keys and its log-sum-exp lse_i; the union's
softmax is their mix by weight e^{lse_i}: o = (e^{lse1}·o1 + e^{lse2}·o2) / (e^{lse1} + e^{lse2}),
lse = log(e^{lse1} + e^{lse2}), computed from lse - max (merge_partials). (SDPA's is_causal
aligns top-left: [s0, s1) against [0, s1) in one call would be silently wrong.)

Backward (flash attention's): from the saved q, k, v, out and the per-row lse, each chunk's
probabilities are P = exp(S - lse) again; with D = rowsum(dO ∘ O) (minus dlse when the lse is
used too), dS = P ∘ (dO·Vᵀ - D), dQ = dS·K·scale, dK += dSᵀ·Q·scale, dV += Pᵀ·dO. Math in fp32;
inputs bf16 or fp32, outputs in the input dtype.

Head and loss. Llama-3's 128,256-vocab logits of one 512K-token sequence are 125 GiB in bf16
(twice that in fp32); a chunk of 4096 tokens is 2 GiB in fp32.

h: (N, D) or (B, S, D), the final norm's output; w_head: (V, D); labels: (N,) or (B, S),
already shifted, IGNORE_INDEX (-100) where a token has no target. The value is
F.cross_entropy(h @ w_headᵀ, labels, reduction="sum", ignore_index=-100): the SUM over the
targets that count, because every runtime divides a step's summed loss by the step's target
count (runtime/base.py's Batches), never by a micro-batch's or a chunk's.

Forward: per chunk, logits = h_c·Wᵀ in the input dtype (as dense.LlamaModel's lm_head under
autocast), then fp32; it keeps each row's logsumexp and adds Σ (lse - logit[label]).
Backward recomputes each chunk's logits: dlogits = g·(softmax - onehot(label)), zero on
ignored rows, dh_c = dlogits·W, dW += dlogitsᵀ·h_c. Autograd saves h, W, labels and lse.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")
IGNORE_INDEX = -100  # torch's cross_entropy default, as runtime/base.py's


def merge_partials(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two disjoint key sets from each set's normalised output
    and log-sum-exp: (o (..., R, E), lse (..., R)). A row with no key in a set has lse -inf
    there and takes the other set's values; fp32. o_i: (..., R, E), lse_i: (..., R)"""
    lse = torch.logaddexp(lse1, lse2)  # (..., R)
    safe = lse.masked_fill(lse == NEG_INF, 0.0)  # a row with no key at all stays 0, not NaN
    w1, w2 = torch.exp(lse1 - safe), torch.exp(lse2 - safe)  # each in [0, 1], summing to 1
    return w1.unsqueeze(-1) * o1 + w2.unsqueeze(-1) * o2, lse


def _keep(
    segments: torch.Tensor | None, s0: int, s1: int, lo: int, hi: int, device: torch.device
) -> torch.Tensor | None:
    """Which keys [lo, hi) queries [s0, s1) see: (B or 1, s1-s0, hi-lo) bool, causal and within
    the query's document; None where that is every key (a prefix without documents)."""
    causal = None
    if hi > s0 + 1:  # some key follows some query: the diagonal block
        qpos = torch.arange(s0, s1, device=device)
        kpos = torch.arange(lo, hi, device=device)
        causal = (kpos[None, :] <= qpos[:, None])[None]  # (1, c, L)
    if segments is None:
        return causal
    same = segments[:, s0:s1, None] == segments[:, None, lo:hi]  # (B, c, L)
    return same if causal is None else same & causal


def _prefix_starts(segments: torch.Tensor | None, bounds: list[tuple[int, int]]) -> list[int]:
    """Each chunk's first key that any of its queries may see: 0 without documents, else the
    first token of the earliest document among its queries (every key before it is masked
    for the whole chunk: 8K-token documents in a 512K sequence leave each chunk 8K of
    prefix, not up to 512K). One host transfer for all chunks."""
    if segments is None:
        return [0] * len(bounds)
    b, s = segments.shape
    # each token's document's first token, for any ids (contiguous or not)
    _, inverse = torch.unique(segments, return_inverse=True)  # (B, S) in [0, U)
    pos = torch.arange(s, device=segments.device).expand(b, s)
    first = torch.full((b, int(inverse.max()) + 1), s, device=segments.device, dtype=pos.dtype)
    first = first.scatter_reduce(1, inverse, pos, "amin").gather(1, inverse)  # (B, S)
    starts = torch.stack([first[:, s0:s1].min() for s0, s1 in bounds])
    return [min(lo, s0) for lo, (s0, _) in zip(starts.tolist(), bounds)]


def _rows(x: torch.Tensor, s0: int, s1: int, kv: int) -> torch.Tensor:
    """Rows [s0, s1) of a (B, H, S, E) tensor as fp32 (B, KV, g·c, E): the g query heads
    of one kv head stacked, so one GEMM per kv head serves them without repeating K or V."""
    b, h, _, e = x.shape
    return x[:, :, s0:s1].float().reshape(b, kv, (h // kv) * (s1 - s0), e)


def _heads(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B, KV, g·c, E) or (B, KV, g·c) back to (B, H, c, E) or (B, H, c)."""
    b, kv, gc = x.shape[:3]
    return x.reshape(b, h, gc * kv // h, *x.shape[3:])


def _masked(s: torch.Tensor, keep: torch.Tensor | None, g: int) -> torch.Tensor:
    """Scores (B, KV, g·c, L) with the unseen keys at -inf, in place; keep (B or 1, c, L)."""
    if keep is not None:
        b, kv, gc, n = s.shape
        s.view(b, kv, g, gc // g, n).masked_fill_(~keep[:, None, None], NEG_INF)
    return s


def _partial(
    qc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: torch.Tensor | None,
    rows: tuple[int, int],
    keys: tuple[int, int],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of the fp32 queries `rows` [s0, s1), qc (B, KV, g·c, hd), over the
    keys [lo, hi) of k, v (B, KV, S, hd/E), causal and within documents: (o (B, KV, g·c, E),
    lse (B, KV, g·c)); a row that sees no key gets o 0 and lse -inf."""
    (s0, s1), (lo, hi) = rows, keys
    keep = _keep(segments, s0, s1, lo, hi, qc.device)  # (B or 1, c, L)
    g = qc.shape[2] // (s1 - s0)
    p = _masked(qc @ k[:, :, lo:hi].float().transpose(-1, -2) * scale, keep, g)  # (B, KV, g·c, L)
    lse = torch.logsumexp(p, -1)  # (B, KV, g·c)
    p.sub_(lse.masked_fill(lse == NEG_INF, 0.0).unsqueeze(-1)).exp_()  # P in place
    return p @ v[:, :, lo:hi].float(), lse


def chunk_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    segments: torch.Tensor | None,
    rows: tuple[int, int],
    lo: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries `rows` [s0, s1) of the sequence, q (B, H, s1-s0, hd), against the keys
    [lo, s1) of k, v (B, KV, >= s1, hd): the diagonal block, causal, merged with the prefix
    [lo, s0) unmasked (both within documents): (out (B, H, c, E) fp32, lse (B, H, c) fp32)."""
    (s0, s1), h, kv = rows, q.shape[1], k.shape[1]
    scale = q.shape[-1] ** -0.5
    qc = _rows(q, 0, s1 - s0, kv)  # (B, KV, g·c, hd)
    o, m = _partial(qc, k, v, segments, (s0, s1), (s0, s1), scale)  # the diagonal
    if lo < s0:  # the prefix, merged by log-sum-exp (the diagonal's rows see themselves)
        o, m = merge_partials(*_partial(qc, k, v, segments, (s0, s1), (lo, s0), scale), o, m)
    return _heads(o, h), _heads(m, h)


def chunk_attention_backward(
    dout: torch.Tensor | None,
    dlse: torch.Tensor | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    segments: torch.Tensor | None,
    rows: tuple[int, int],
    lo: int = 0,
    hi: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of chunk_attention_forward's (out, lse) for queries `rows` [s0, s1):
    (dq (B, H, c, hd), dk and dv of the keys [lo, hi) (B, KV, hi-lo, hd/E); hi: s1 unless
    given), all fp32. q, out (B, H, c, .), lse (B, H, c); k, v (B, KV, >= hi, .); dout,
    dlse like out, lse."""
    (s0, s1), h, kv = rows, q.shape[1], k.shape[1]
    hi = s1 if hi is None else hi
    scale, g, c = q.shape[-1] ** -0.5, h // kv, s1 - s0
    qc = _rows(q, 0, c, kv)  # (B, KV, g·c, hd)
    kc, vc = k[:, :, lo:hi].float(), v[:, :, lo:hi].float()  # (B, KV, L, hd/E)
    keep = _keep(segments, s0, s1, lo, hi, q.device)  # (B or 1, c, L)
    p = _masked(qc @ kc.transpose(-1, -2) * scale, keep, g)  # scores (B, KV, g·c, L)
    p.sub_(_rows(lse.unsqueeze(-1), 0, c, kv)).exp_()  # P (B, KV, g·c, L), recomputed
    dv = torch.zeros_like(vc)
    if dout is not None:
        do = _rows(dout, 0, c, kv)  # (B, KV, g·c, E)
        rowsum = (do * _rows(out, 0, c, kv)).sum(-1, keepdim=True)  # D (.., g·c, 1)
        ds = (do @ vc.transpose(-1, -2)).sub_(rowsum)  # dP - D
        dv += p.transpose(-1, -2) @ do
    else:
        ds = torch.zeros_like(p)
    if dlse is not None:  # d lse_i / d s_ij = P_ij
        ds.add_(_rows(dlse.unsqueeze(-1), 0, c, kv))
    ds.mul_(p)  # dS = P ∘ (dP - D + dlse)
    del p
    dq = _heads(ds @ kc, h) * scale
    dk = (ds.transpose(-1, -2) @ qc) * scale
    return dq, dk, dv


def _block_rows(c: int, n: int, causal: bool) -> tuple[int, int]:
    """Positions of c queries over keys [0, n): its last c (causal, bottom-right) or after."""
    return (n - c, n) if causal else (n, n + c)


def block_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries q (B, H, c, hd) over one block of keys k, v (B, KV, n, hd), every key or
    `causal` bottom-right: (out (B, H, c, E), lse (B, H, c)) fp32, for merge_partials."""
    h, kv, n = q.shape[1], k.shape[1], k.shape[2]
    rows, scale = _block_rows(q.shape[2], n, causal), q.shape[-1] ** -0.5
    o, m = _partial(_rows(q, 0, q.shape[2], kv), k, v, None, rows, (0, n), scale)
    return _heads(o, h), _heads(m, h)


def block_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq (B, H, c, hd), dk, dv (B, KV, n, hd)) fp32: block_attention_forward's block's
    exact share given the whole row's out and lse, as a fused kernel's call."""
    rows = _block_rows(q.shape[2], k.shape[2], causal)
    return chunk_attention_backward(dout, None, q, k, v, out, lse, None, rows, 0, k.shape[2])


class _ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, segments, chunk):
        b, h, s, _ = q.shape
        bounds = [(s0, min(s0 + chunk, s)) for s0 in range(0, s, chunk)]
        starts = _prefix_starts(segments, bounds)
        out = q.new_empty(b, h, s, v.shape[-1])  # (B, H, S, E), the input dtype
        lse = q.new_empty(b, h, s, dtype=torch.float32)  # (B, H, S)
        for (s0, s1), lo in zip(bounds, starts):
            o, m = chunk_attention_forward(q[:, :, s0:s1], k, v, segments, (s0, s1), lo)
            out[:, :, s0:s1], lse[:, :, s0:s1] = o, m
        ctx.save_for_backward(q, k, v, out, lse, segments)
        ctx.bounds, ctx.starts = bounds, starts
        ctx.set_materialize_grads(False)  # an unused out or lse brings no zeros to read
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, segments = ctx.saved_tensors
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)  # (B, H, S, hd)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)  # (B, KV, S, hd)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)  # (B, KV, S, E)
        for (s0, s1), lo in zip(ctx.bounds, ctx.starts):
            rows = slice(s0, s1)
            dq[:, :, rows], dkc, dvc = chunk_attention_backward(
                None if dout is None else dout[:, :, rows],
                None if dlse is None else dlse[:, :, rows],
                q[:, :, rows],
                k,
                v,
                out[:, :, rows],
                lse[:, :, rows],
                segments,
                (s0, s1),
                lo,
            )
            dk[:, :, lo:s1] += dkc
            dv[:, :, lo:s1] += dvc
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def _check(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int, segments: torch.Tensor | None
) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (B, heads, S, hd); got {q.shape}, {k.shape}, {v.shape}")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads")
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 token, got {chunk}")
    if segments is not None and segments.shape != (q.shape[0], q.shape[2]):
        raise ValueError(f"segments {tuple(segments.shape)} is not (B, S) = {q.shape[::2]}")


def chunked_attention_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunk: int,
    segments: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, S, E) in q's dtype, lse (B, H, S) fp32, the log-sum-exp of each row's
    scaled scores); both carry gradients (a later merge may weigh by the lse). q (B, H, S, hd),
    k (B, KV, S, hd), v (B, KV, S, E), segments (B, S) or None: see the module docstring."""
    _check(q, k, v, chunk, segments)
    out, lse = _ChunkedAttention.apply(q, k, v, segments, chunk)
    return out, lse


def chunked_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunk: int,
    segments: torch.Tensor | None = None,
) -> torch.Tensor:
    """dense.causal_attention (with mask=document_mask(segments) when given), `chunk` queries
    at a time; autograd saves q, k, v, out and the lse only. (B, H, S, hd), (B, KV, S, hd) x2
    -> (B, H, S, hd)"""
    return chunked_attention_lse(q, k, v, chunk, segments)[0]


# ---------------------------------------------------------------- head and loss


def _chunk_logits(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 logits (c, V) of h (c, D) through w (V, D), the GEMM in the input dtype."""
    return F.linear(h, w).float()


class _ChunkedLMLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, labels, chunk, ignore_index):
        n = h.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=h.device)  # (N,)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for s0 in range(0, n, chunk):
            s1 = min(s0 + chunk, n)
            logits = _chunk_logits(h[s0:s1], w)  # (c, V)
            lse[s0:s1] = torch.logsumexp(logits, -1)
            y = labels[s0:s1]  # (c,)
            counted = y != ignore_index
            picked = logits.gather(1, torch.where(counted, y, 0).unsqueeze(1)).squeeze(1)  # (c,)
            total += torch.where(counted, lse[s0:s1] - picked, 0.0).sum()
        ctx.save_for_backward(h, w, labels, lse)
        ctx.chunk, ctx.ignore_index = chunk, ignore_index
        return total

    @staticmethod
    def backward(ctx, grad):
        h, w, labels, lse = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[:2]
        n = h.shape[0]
        dh = torch.empty_like(h) if want_h else None  # (N, D)
        # dW sums over every chunk: in fp32 for a bf16 head (a bf16 running sum would round
        # each chunk's contribution to 8 bits of mantissa)
        dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if want_w else None
        for s0 in range(0, n, ctx.chunk):
            s1 = min(s0 + ctx.chunk, n)
            y = labels[s0:s1]  # (c,)
            counted = y != ctx.ignore_index
            dl = _chunk_logits(h[s0:s1], w)  # (c, V)
            dl.sub_(lse[s0:s1].unsqueeze(1)).exp_()  # softmax, in place
            dl.scatter_add_(
                1, torch.where(counted, y, 0).unsqueeze(1), -counted.unsqueeze(1).to(dl.dtype)
            )  # - onehot(label) on counted rows
            dl.mul_((counted.to(dl.dtype) * grad).unsqueeze(1))  # ignored rows: 0
            dl_in = dl.to(h.dtype)  # (c, V) in the input dtype, as autograd's would be
            if dh is not None:
                dh[s0:s1] = dl_in @ w
            if dw is not None:
                dw.addmm_(dl.t(), h[s0:s1].float())
        return (
            dh,
            dw.to(w.dtype) if dw is not None else None,
            None,
            None,
            None,
        )


def chunked_lm_loss(
    h: torch.Tensor,
    w_head: torch.Tensor,
    labels: torch.Tensor,
    chunk: int,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Σ cross_entropy(h @ w_headᵀ, labels) over the labels that are not `ignore_index`, as a
    0-d fp32 tensor, `chunk` tokens of logits at a time; the caller divides by its target
    count. h (N, D) or (B, S, D), w_head (V, D), labels (N,) or (B, S)."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 token, got {chunk}")
    hf, yf = h.reshape(-1, h.shape[-1]), labels.reshape(-1)  # (N, D), (N,)
    if hf.shape[0] != yf.shape[0] or w_head.dim() != 2 or w_head.shape[1] != hf.shape[1]:
        raise ValueError(
            f"h {tuple(h.shape)}, w_head {tuple(w_head.shape)}, labels {tuple(labels.shape)} "
            "are not (N, D), (V, D), (N,)"
        )
    loss: torch.Tensor = _ChunkedLMLoss.apply(hf, w_head, yf, chunk, ignore_index)
    return loss
