"""Saved-activation levels per (layer, chunk) for a working-set plan.

Level 0 saves a layer's input only and recomputes the whole layer in backward; level 2 also
keeps the MLP's lean set (h, gate, up: worker/lean_mlp.py) so backward recomputes only the
attention block. Outside the device window a level-2 chunk's set travels home during the
layer's forward, so a layer may hold as many level-2 chunks as the D2H link carries in its
forward time (AdaWS §3.2.4: the write buffer must be free in time), spread evenly over its
chunks. Inside the window, level-2 chunks are bought with spare device memory, last layers
first. Host memory bounds both. (The autoconfigurator issue replaces this greedy rule with
AdaWS's dynamic program over all four levels.)
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.contracts import JobSpec
from scheduler.model_dims import ModelDims

# Forward passes of one layer recomputed in backward, by level (measured shares of an
# 8B layer's forward at 8K: MLP ~0.7, attention block ~0.3).
RECOMPUTE_FORWARDS = (1.0, 0.7, 0.3, 0.02)
# Plan the link to half its measured rate: gradients, prefetches and the device optimizer
# share it, and at 80% the write buffer stalled 1.6-3.3 s a step (bench/RESULTS.md).
LINK_SHARE = 0.5


@dataclass(frozen=True)
class Levels:
    levels: list[list[int]]  # [layer][chunk]
    device_bytes: int  # extra device bytes the window's level-2 chunks take
    host_bytes: int  # extra host bytes the home level-2 chunks take
    recompute_forwards: float  # layer forwards recomputed per round, over all (layer, chunk)


def lean_bytes_per_seq(dims: ModelDims, spec: JobSpec, element_bytes: int) -> int:
    return spec.seq_len * element_bytes * (dims.hidden_size + 2 * dims.intermediate_size)


def layer_forward_seconds(dims: ModelDims, seq_len: int, matmul_flops: float) -> float:
    """One sequence through one layer's forward."""
    attn = 2 * seq_len * dims.num_heads * dims.head_dim  # per token, causal QK^T and PV
    return seq_len * (2 * dims.layer_params + attn) / matmul_flops


def _spread(n: int, chunks: int) -> list[int]:
    """n level-2 chunks spread evenly over `chunks` (so D2H traffic stays even)."""
    return [2 if (c + 1) * n // chunks > c * n // chunks else 0 for c in range(chunks)]


def uniform(dims: ModelDims, chunks: int, level: int) -> Levels:
    return Levels([[level] * chunks for _ in range(dims.num_layers)], 0, 0,
                  dims.num_layers * chunks * RECOMPUTE_FORWARDS[level])


def assign(dims: ModelDims, spec: JobSpec, element_bytes: int, chunks: int, window: int,
           d2h_bytes_per_s: float, matmul_flops: float, spare_device: int,
           spare_host: int, other_home_bytes: int = 0) -> Levels:
    """other_home_bytes: what else crosses the D2H link during a layer's forward."""
    L = dims.num_layers
    lean = lean_bytes_per_seq(dims, spec, element_bytes)
    inputs = spec.seq_len * dims.hidden_size * element_bytes
    link = (LINK_SHARE * d2h_bytes_per_s * chunks
            * layer_forward_seconds(dims, spec.seq_len, matmul_flops))
    free = link - chunks * inputs - other_home_bytes
    per_home_layer = max(0, min(chunks, int(free // lean)))
    home_layers = L - window
    while per_home_layer and home_layers * per_home_layer * lean > spare_host:
        per_home_layer -= 1
    in_window = max(0, min(window * chunks, spare_device // lean)) if lean else 0
    levels = []
    for k in range(L):
        if k < home_layers:
            levels.append(_spread(per_home_layer, chunks))
        else:
            # window layers fill from the last one down: those are backward's first
            rank = L - 1 - k
            n = max(0, min(chunks, in_window - rank * chunks))
            levels.append(_spread(n, chunks))
    n2 = sum(row.count(2) for row in levels)
    recompute = n2 * RECOMPUTE_FORWARDS[2] + (L * chunks - n2) * RECOMPUTE_FORWARDS[0]
    return Levels(levels, min(in_window, window * chunks) * lean,
                  home_layers * per_home_layer * lean, recompute)
