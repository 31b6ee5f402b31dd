"""Saved-activation levels per (layer, chunk) for a working-set plan: AdaWS §3.2.4's dynamic
program, maximising avoided recomputation subject to "the write buffer is free in time".

Levels (working_set/schedule.py): 0 saves a layer's input only (backward recomputes the layer
but the MLP's down projection), 1 adds the attention kernel's saved set (recompute the output
projection and the MLP's gate/up), 2 the MLP's lean set gate/up (recompute attention), 3
both. Outside the device window every (layer, chunk)'s saved set
travels home over the D2H link in forward order; the link is FIFO, so after chunk j its
backlog is b_j = max(0, b_{j-1} - compute_j) + transfer_j, and the write buffer is free in
time when b_j never exceeds the cap (AdaWS: finished before the chunk W layers later starts;
here also: never more bytes in flight than the worker's write buffer holds).

The DP runs over layers with the backlog at the layer's end as its state (discretised,
transfers rounded up, compute rounded down, so it never under-estimates the backlog). A
layer's chunks are identical, and with one link constraint the LP optimum mixes at most two
levels (adjacent on the value-per-byte hull), so a layer's decision is a pair of levels and a
count, spread evenly over its chunks; each pattern is simulated chunk by chunk against the
cap. 64 layers x 32 chunks x 4 levels solve in a few milliseconds (tests/planning).

    sol = solve(layers)               # layers: list[LayerCost], in forward order
    sol.best_s(h), sol.levels(h)      # value and levels per (layer, chunk) of the first h
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from wstrain.contracts.calibration import LEVELS

ArrayOrFloat = np.ndarray | float
BUCKETS = 64  # backlog states up to the largest cap, at least
MAX_BUCKETS = 256


@dataclass(frozen=True)
class LayerCost:
    """One home layer's chunks as the DP sees them (all times in seconds, per round)."""

    chunks: int
    compute_s: float  # one chunk's forward
    transfer_s: tuple[float, ...]  # per level: the chunk's saved set home over the link
    value_s: tuple[float, ...]  # per level: recomputation avoided in backward vs level 0
    cap_s: float  # the backlog allowed after any of its chunks (the write buffer)
    # Its backward: saved sets come back on the inbound stream, overlapped with compute, by a
    # rolling prefetch that keeps up to the cap in flight (working_set/saved_acts.py
    # BackwardPrefetch); a set larger than the cap is fetched when needed, on the compute
    # stream.
    back_s: tuple[float, ...] = (0.0,) * LEVELS  # per level, at the inbound rate
    prefetch_cap_s: float = 0.0
    inbound_s: float = 0.0  # weights and accumulated gradients in
    busy_s: float = 0.0  # backward compute of all chunks, recomputation aside
    # Per chunk, per level: value beyond value_s from the chunk's place in its sequence. A
    # long sequence's pieces are alike but for causal attention, which grows with a piece's
    # prefix: at 128K in 16K pieces the last piece's attention forward is 15x the first's,
    # so which pieces recompute it matters. () where chunks are alike.
    unit_value_s: tuple[tuple[float, ...], ...] = ()
    # Seconds beyond a chunk's compute_s that the link drains its backlog in: with cross-round
    # overlap the paired backward chunk of the previous pass runs beside each forward chunk
    # (less that backward's weight gradients going home). 0 per round.
    drain_s: float = 0.0

    def value_of(self, chunk: int, level: int) -> float:
        """Recomputation one chunk at `level` avoids in backward, against level 0."""
        extra = self.unit_value_s[chunk][level] if self.unit_value_s else 0.0
        return self.value_s[level] + extra

    def row_costs(self, pats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(recomputation, exposed backward transfer) seconds of each (P, C) pattern."""
        recompute = pats.shape[1] * self.compute_s - np.asarray(self.value_s)[pats].sum(axis=1)
        if self.unit_value_s:
            by_chunk = np.asarray(self.unit_value_s)  # (C, LEVELS)
            recompute -= by_chunk[np.arange(pats.shape[1]), pats].sum(axis=1)
        back_s = np.asarray(self.back_s)
        inline = np.where(back_s > self.prefetch_cap_s, back_s, 0.0)[pats].sum(axis=1)
        prefetched = back_s[pats].sum(axis=1) - inline
        exposed = inline + self.inbound_exposed(recompute, prefetched)
        return recompute, exposed

    def inbound_exposed(
        self, recompute_s: ArrayOrFloat, prefetched_s: ArrayOrFloat = 0.0
    ) -> ArrayOrFloat:
        """Backward transfer in (weights, gradients, prefetched sets) not hidden behind the
        layer's backward and recomputation; floats or arrays."""
        return np.maximum(0.0, self.inbound_s + prefetched_s - self.busy_s - recompute_s)

    def pattern_value(self, pats: np.ndarray) -> np.ndarray:
        """(P,) seconds saved against recomputing every chunk with nothing exposed."""
        recompute, exposed = self.row_costs(pats)
        return pats.shape[1] * self.compute_s - recompute - exposed


EXHAUSTIVE_PATTERNS = 256


@functools.lru_cache(maxsize=64)
def patterns(chunks: int, tail: bool = False) -> np.ndarray:
    """(P, chunks) level patterns: n chunks at level hi and the rest at lo (lo < hi), spread
    evenly three ways (marked chunk last in its stretch, first, or spanning both ends: a
    large saved set drains best with the most compute between two) and, with `tail`, the
    last n together (a sequence's last pieces, whose attention costs most), plus the uniform
    ones; for up to four chunks simply every pattern (mixes of three or four levels win
    there)."""
    if LEVELS**chunks <= EXHAUSTIVE_PATTERNS:
        return np.array(list(itertools.product(range(LEVELS), repeat=chunks)), dtype=np.int64)
    n = np.arange(1, chunks + 1)[:, None]
    c = np.arange(chunks)[None, :]
    late = (c + 1) * n // chunks > c * n // chunks  # (chunks, chunks): n marked chunks
    early, ends = np.zeros_like(late), np.zeros_like(late)
    for k in range(chunks):  # k + 1 marked: chunks ceil(i·C/n), and both ends included
        i = np.arange(k + 1)
        early[k, -(-i * chunks // (k + 1))] = True
        ends[k, (i * (chunks - 1) + k // 2) // max(k, 1)] = True
    last = c >= chunks - n if tail else np.zeros((0, chunks), dtype=bool)  # the last n
    spread = np.concatenate([late, early, ends, last, np.zeros((1, chunks), dtype=bool)])
    rows = [np.where(spread, hi, lo) for lo in range(LEVELS) for hi in range(lo + 1, LEVELS)]
    return np.unique(np.concatenate(rows), axis=0).astype(np.int64)


@dataclass
class _Table:
    """For one layer type: each pattern's end state and feasibility from each start state."""

    pats: np.ndarray  # (P, C)
    # The feasible (pattern, start) pairs sorted by end state, for a segmented max:
    start_of: np.ndarray  # (F,) start state of each pair
    pat_of: np.ndarray  # (F,) its pattern
    value_of: np.ndarray  # (F,) its pattern's value
    seg_starts: np.ndarray  # where each present end state's segment begins
    states: np.ndarray  # the end states present


def _quantum(layers: list[LayerCost]) -> tuple[float, int]:
    """(quantum, states): at least BUCKETS states up to the largest cap, and where it costs
    at most MAX_BUCKETS states, a quantum that divides the first layer's compute time
    exactly, so draining the backlog is not rounded (only transfers are, upwards)."""
    cap_s = max([lc.cap_s for lc in layers] + [1e-12])
    quantum_s = cap_s / (BUCKETS - 1)
    compute_s = layers[0].compute_s + layers[0].drain_s if layers else 0.0
    if compute_s > 0:
        exact = compute_s / np.ceil(compute_s / quantum_s - 1e-9)
        if cap_s / exact < MAX_BUCKETS - 1:
            quantum_s = exact
    return quantum_s, int(np.floor(cap_s / quantum_s + 1e-9)) + 1


def _table(layer: LayerCost, quantum_s: float, T: int) -> _Table:
    pats = patterns(layer.chunks, tail=bool(layer.unit_value_s))
    tr = np.ceil(np.asarray(layer.transfer_s) / quantum_s - 1e-9).astype(np.int64)
    dt = int(np.floor((layer.compute_s + layer.drain_s) / quantum_s + 1e-9))
    cap = min(int(np.floor(layer.cap_s / quantum_s + 1e-9)), T - 1)
    b = np.broadcast_to(np.arange(T), (len(pats), T)).copy()  # (P, T) backlog per start
    peak = b.copy()
    arrivals = tr[pats]  # (P, C)
    for c in range(layer.chunks):
        b -= dt
        np.maximum(b, 0, out=b)
        b += arrivals[:, c : c + 1]
        np.maximum(peak, b, out=peak)
    ok = peak <= cap
    value = layer.pattern_value(pats)
    # Inputs always go home (level 0): where even they outrun the link, the compute stream
    # waits on the write buffer for the excess instead of the plan being impossible.
    ok[0] = True  # pats[0] is all level 0 (np.unique sorts it first)
    value[0] -= layer.chunks * max(0.0, layer.transfer_s[0] - layer.compute_s - layer.drain_s)
    nxt = np.minimum(b, T - 1)
    feasible = np.flatnonzero(ok.ravel())
    order = feasible[np.argsort(nxt.ravel()[feasible], kind="stable")]
    ends = nxt.ravel()[order]
    seg_starts = np.flatnonzero(np.r_[True, ends[1:] != ends[:-1]]) if len(ends) else ends
    states = ends[seg_starts]
    return _Table(pats, order % T, order // T, value[order // T], seg_starts, states)


@dataclass(frozen=True)
class Solution:
    """The DP after its one forward pass: answers for every number of home layers h."""

    tables: list[_Table]  # per layer
    values: list[np.ndarray]  # (T,) best value per backlog state after h layers, h = 0..L

    def best_s(self, home_layers: int) -> float:
        """The largest total value the first `home_layers` layers can reach."""
        return float(self.values[home_layers].max())

    def levels(self, home_layers: int) -> list[list[int]]:
        """The optimal patterns of the first `home_layers` layers, by backtracking."""
        state = int(np.argmax(self.values[home_layers]))
        out: list[list[int]] = []
        for h in range(home_layers - 1, -1, -1):  # which (pattern, start) reached `state`
            tab, prev = self.tables[h], self.values[h]
            i = int(np.searchsorted(tab.states, state))
            end = tab.seg_starts[i + 1] if i + 1 < len(tab.states) else len(tab.start_of)
            seg = slice(tab.seg_starts[i], end)
            best = seg.start + int(np.argmax(prev[tab.start_of[seg]] + tab.value_of[seg]))
            state = int(tab.start_of[best])
            out.append(tab.pats[tab.pat_of[best]].tolist())
        out.reverse()
        return out


def solve(layers: list[LayerCost]) -> Solution:
    """One forward pass of the DP over the layers in forward order; the solution answers for
    every number of home layers at once (the planner tries every window)."""
    quantum_s, T = _quantum(layers)
    cache: dict[LayerCost, _Table] = {}
    val = np.full(T, -np.inf)
    val[0] = 0.0
    tables, values = [], [val]
    for lc in layers:
        tab = cache.get(lc) or cache.setdefault(lc, _table(lc, quantum_s, T))
        val = np.full(T, -np.inf)
        if len(tab.states):
            cand = values[-1].take(tab.start_of) + tab.value_of  # feasible pairs by end state
            val[tab.states] = np.maximum.reduceat(cand, tab.seg_starts)
        tables.append(tab)
        values.append(val)
    return Solution(tables, values)


def _walk(layers: list[LayerCost], levels: list[list[int]]) -> tuple[float, float]:
    """(peak link backlog if compute never waited, seconds compute waits on a full write
    buffer) of an assignment, in continuous time."""
    free = capped = peak = stall = 0.0
    for lc, row in zip(layers, levels):
        drain_s = lc.compute_s + lc.drain_s
        for lv in row:
            free = max(0.0, free - drain_s) + lc.transfer_s[lv]
            peak = max(peak, free)
            capped = max(0.0, capped - drain_s) + lc.transfer_s[lv]
            if capped > lc.cap_s:
                stall, capped = stall + capped - lc.cap_s, lc.cap_s
    return peak, stall


def write_buffer_stall_s(layers: list[LayerCost], levels: list[list[int]]) -> float:
    """Seconds compute waits on a full write buffer in one round's forward (0 for a plan the
    DP made; hand-made levels may overrun the link)."""
    return _walk(layers, levels)[1]


def cheapest_drops(
    lc: LayerCost, levels: list[list[int]], saved: list[int]
) -> Iterator[tuple[int, int, int, int]]:
    """Steps down in level that free saved bytes, the least recomputation added per byte
    freed first, as (layer, chunk, new level, bytes freed); each (layer, chunk) steps again
    from its new level. What a plan over the host budget gives up: a sequence's first
    pieces (short prefixes) before its last, and level 3 to 1 before 1 to 0 where the MLP's
    set is the cheaper to recompute. `levels` is read once, not changed."""
    now = [list(row) for row in levels]
    steps: dict[tuple[int, int], tuple[float, int, int] | None] = {}  # alike in every layer

    def step(c: int, lv: int) -> tuple[float, int, int] | None:
        if (c, lv) not in steps:
            down = [
                ((lc.value_of(c, lv) - lc.value_of(c, lo)) / (saved[lv] - saved[lo]), lo)
                for lo in range(lv)
                if saved[lo] < saved[lv]
            ]
            steps[c, lv] = None
            if down:
                density, lo = min(down)
                steps[c, lv] = (density, lo, saved[lv] - saved[lo])
        return steps[c, lv]

    heap = [
        (s[0], k, c, s[1], s[2])
        for k, row in enumerate(now)
        for c, lv in enumerate(row)
        if (s := step(c, lv)) is not None
    ]
    heapq.heapify(heap)
    while heap:
        _, k, c, lo, freed = heapq.heappop(heap)
        now[k][c] = lo
        yield k, c, lo, freed
        if (s := step(c, lo)) is not None:
            heapq.heappush(heap, (s[0], k, c, s[1], s[2]))


def simulate(layers: list[LayerCost], levels: list[list[int]]) -> float:
    """The peak link backlog (s) of an assignment, in continuous time."""
    return _walk(layers, levels)[0]
