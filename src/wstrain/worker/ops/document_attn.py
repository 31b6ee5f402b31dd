"""A long-context piece's attention over packed documents (document_mask with seq_chunk): the
queries [s0, s1) of each sequence see only the keys of their own document at or before
them. A document is a run of equal ids in a sequence's row of segments, so within a piece
its queries [max(a, s0), min(e, s1)) and its keys [a, min(e, s1)) form one causal attention
with the mask aligned bottom-right, exactly what ops/prefix_attn.py computes for a sequence
with its prefix. Each (sequence, document) that meets the piece is one such call on its own
slices of q, the window's K and V and the output: the fused kernels (cuDNN's prefix and
diagonal, FA2's bottom-right mask) take it as they take a plain piece, never a dense mask,
and a document's cost is its own keys', not the whole prefix's (8K-token documents in a
512K sequence: 8K keys a query at most).

    runs = document_runs(segments)                       # host, once a pass: (B, S) ids
    out, lse = document_attention(q, k, v, s0, runs)     # q (B, H, c, hd); k, v (B, KV, s1, hd)
    dq = document_attention_backward(dout, q, k, v, out, lse, s0, dk_sum, dv_sum, runs)

The runs are read on the host once a pass (one transfer); a piece then costs one kernel
call per document it meets (a 4K piece of 512-token documents: 8 calls a sequence).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from wstrain.worker.ops.prefix_attn import prefix_attention, prefix_attention_backward

Runs = tuple[tuple[tuple[int, int], ...], ...]  # per sequence: its documents' [start, end)


def document_runs(segments: torch.Tensor) -> Runs:
    """Each sequence's documents as [start, end) runs of equal ids in `segments` (B, S).
    An id that comes back after another document is refused: the dense mask would join
    its two runs, and a packed sequence never holds one document twice."""
    rows = segments.cpu()
    out = []
    for b, row in enumerate(rows):
        cuts = (torch.nonzero(row[1:] != row[:-1]).flatten() + 1).tolist()
        bounds = [0, *cuts, row.numel()]
        runs = tuple(itertools.pairwise(bounds))
        ids = row[bounds[:-1]]
        if torch.unique(ids).numel() != len(runs):
            raise ValueError(
                f"sequence {b} of the pass holds a document id in {len(runs)} runs but "
                f"{torch.unique(ids).numel()} distinct ids: each packed document must be one "
                "contiguous run of tokens (segments as wstrain.worker.io.data packs them)"
            )
        out.append(runs)
    return tuple(out)


def _meets(s0: int, s1: int, runs: Runs) -> Iterator[tuple[int, int, int, int]]:
    """(sequence, document start, first query, end of queries) for every document that
    holds some of the queries [s0, s1)."""
    for b, row in enumerate(runs):
        for a, e in row:  # in order: none after the first that starts past the queries
            if a >= s1:
                break
            qa, qb = max(a, s0), min(e, s1)
            if qa < qb:
                yield b, a, qa, qb


def document_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s0: int, runs: Runs
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, c, E) in q's dtype, lse (B, H, c) fp32) of queries [s0, s0+c) over the keys
    of their documents: q (B, H, c, hd); k, v (B, KV, >= s0+c, hd); runs for these B
    sequences (more rows than B: the first B are taken)."""
    b, h, c, _ = q.shape
    out = torch.empty((b, h, c, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, c), dtype=torch.float32, device=q.device)
    for i, a, qa, qb in _meets(s0, s0 + c, runs[:b]):
        rows, keys = slice(qa - s0, qb - s0), slice(a, qb)
        o, m = prefix_attention(
            q[i : i + 1, :, rows].contiguous(),
            k[i : i + 1, :, keys],
            v[i : i + 1, :, keys],
            qa - a,
        )
        out[i : i + 1, :, rows] = o
        lse[i : i + 1, :, rows] = m
    return out, lse


def document_attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    s0: int,
    dk_sum: torch.Tensor,
    dv_sum: torch.Tensor,
    runs: Runs,
) -> torch.Tensor:
    """dq (B, H, c, hd) fp32 of document_attention's queries; each document's keys' and
    values' gradients added into its rows of dk_sum, dv_sum (B, KV, >= s0+c, hd) fp32."""
    b, _, c, _ = q.shape
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for i, a, qa, qb in _meets(s0, s0 + c, runs[:b]):
        rows, keys = slice(qa - s0, qb - s0), slice(a, qb)
        one = slice(i, i + 1)
        dq[one, :, rows] = prefix_attention_backward(
            dout[one, :, rows].contiguous(),
            q[one, :, rows].contiguous(),
            k[one, :, keys],
            v[one, :, keys],
            out[one, :, rows].contiguous(),
            lse[one, :, rows].contiguous(),
            qa - a,
            dk_sum[one, :, keys],
            dv_sum[one, :, keys],
        )
    return dq
