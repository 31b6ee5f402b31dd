"""One working-set candidate of the autoconfigurator (planning/working_set.py searches them):
at a layout and window, the window's levels bought with spare device memory, each window's
per-round cost, and the finished candidate, its home levels from the levels DP (with the
cross-round overlap, the later rounds' and the first pass's), cut to the host budget, with
its device and host bytes and its predicted step.

    for cost, w, win in window_costs(dims, spec, lay, sol, lc): ...
    cand = finish(dims, spec, node, lay, sol, w, win.rows(), device)   # or None
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from wstrain.contracts.calibration import LEVELS
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import JobSpec
from wstrain.planning import cost_model as cm
from wstrain.planning import memory_model as mm
from wstrain.planning.levels import LayerCost, Solution, cheapest_drops


@dataclass(frozen=True)
class Candidate:
    lay: mm.Layout
    window: int
    time: cm.StepTime
    levels: list[list[int]]
    device_bytes: int
    host_bytes: int
    first_levels: list[list[int]] | None = None  # with overlap: the step's first pass's


@dataclass(frozen=True)
class Window:
    """Window levels bought with spare device memory, as counts over the window's chunks in
    backward order (last layer first, a layer's last chunk first: a sequence's last pieces
    are worth the most): `top` at level 3, then up to `n` at `level`."""

    layers: int
    chunks: int
    level: int = 0
    n: int = 0
    top: int = 0

    def rows(self) -> list[list[int]]:
        X, top, n = self.chunks, self.top, self.n
        if not 0 <= top <= n <= self.layers * X:  # never so from fill_window: as laid out
            flat = [3] * top + [self.level] * (n - top)
            flat += [0] * (self.layers * X - n)
            return [flat[i * X : (i + 1) * X][::-1] for i in range(self.layers)][::-1]
        # in backward order the flat units [0, top) at 3, [top, n) at `level`, the rest at 0;
        # a row wholly in one of them is built whole (the search asks at every candidate)
        out = []
        for i in range(self.layers - 1, -1, -1):
            lo, hi = i * X, (i + 1) * X
            if hi <= top or lo >= n or (lo >= top and hi <= n):
                out.append([3 if hi <= top else 0 if lo >= n else self.level] * X)
            else:
                out.append(
                    [
                        3 if k < top else self.level if k < n else 0
                        for k in range(hi - 1, lo - 1, -1)
                    ]
                )
        return out

    def cost_s(
        self, lc: LayerCost, rows: dict[tuple[int, int, int, int], float] | None = None
    ) -> float:
        """Per round: recomputation left in the window plus its exposed backward transfer
        (rows wholly at one level are counted in bulk; at most two rows are mixed). `rows`:
        a row's cost by (level, chunks, n3, nl), kept across the windows of one `lc` (a row's cost
        does not depend on the window)."""
        X = self.chunks
        rec = [lc.compute_s - v for v in lc.value_s]
        memo = {} if rows is None else rows

        def row(n3: int, nl: int) -> float:
            key = (self.level, X, n3, nl)
            if key not in memo:
                memo[key] = costed_row(n3, nl)
            return memo[key]

        def costed_row(n3: int, nl: int) -> float:  # as rows() lays it out: level 3 last
            r = n3 * rec[3] + nl * rec[self.level] + (X - n3 - nl) * rec[0]
            if lc.unit_value_s:  # pieces: each by its prefix
                pattern = [0] * (X - n3 - nl) + [self.level] * nl + [3] * n3
                r -= sum(lc.unit_value_s[c][lv] for c, lv in enumerate(pattern))
            return r + float(lc.inbound_exposed(r))

        def overlap(r: int, lo: int, hi: int) -> int:
            return max(0, min(hi, (r + 1) * X) - max(lo, r * X))

        bounds = (self.top, self.n)
        mixed = {b // X for b in bounds if b % X and b // X < self.layers}
        full3, full_l = self.top // X, self.n // X - -(-self.top // X)
        cost = full3 * row(X, 0) + max(0, full_l) * row(0, X)
        cost += (self.layers - full3 - max(0, full_l) - len(mixed)) * row(0, 0)
        for r in mixed:
            cost += row(overlap(r, 0, self.top), overlap(r, self.top, self.n))
        return cost


def fill_window(
    window: int, lc: LayerCost, saved: list[int], spare_bytes: float, best: int | None = None
) -> Window:
    """The best value per byte first, then level 3, last layers first (backward meets them
    first). `best`: best_level(lc, saved), where the caller has it."""
    X = lc.chunks
    extra = [b - saved[0] for b in saved]
    if best is None:
        best = best_level(lc, saved)
    n_best = int(min(window * X, max(0.0, spare_bytes) // max(extra[best], 1)))
    spare_bytes -= n_best * extra[best]
    n_top = 0
    if best != 3 and lc.value_s[3] > lc.value_s[best]:
        n_top = int(min(n_best, max(0.0, spare_bytes) // max(extra[3] - extra[best], 1)))
    return Window(window, X, best, n_best, n_top)


def best_level(lc: LayerCost, saved: list[int]) -> int:
    """The window level of the most value per byte beyond a level-0 set."""
    extra = [b - saved[0] for b in saved]
    return max(range(1, LEVELS), key=lambda lv: lc.value_s[lv] / max(extra[lv], 1))


def window_costs(
    dims: ModelDims, spec: JobSpec, lay: mm.Layout, sol: Solution, lc: LayerCost
) -> list[tuple[float, int, Window]]:
    """(per-round recomputation + exposed backward transfer, window, window levels) for
    every window this layout fits."""
    L, X, forced = dims.num_layers, lay.units, spec.overrides.level
    windows = [spec.overrides.window] if spec.overrides.window is not None else range(L + 1)
    saved = mm.saved_bytes_by_level(dims, spec, lay.seq_chunk, home=False)
    forced_value = None if forced is None else float(lc.pattern_value(np.full((1, X), forced))[0])
    best = best_level(lc, saved)  # the same at every window
    rows: dict[tuple[int, int, int, int], float] = {}
    out = []
    for w, spare in zip(windows, mm.spare_window_bytes_each(dims, spec, lay, windows)):
        if spare < 0:
            continue
        if forced is None:
            home_value = sol.best_s(L - w)
            win = fill_window(w, lc, saved, spare, best)
        else:
            if w * X * (saved[forced] - saved[0]) > spare:
                continue
            assert forced_value is not None  # set whenever `forced` is
            home_value, win = (L - w) * forced_value, Window(w, X, forced, w * X)
        if home_value == float("-inf"):
            continue
        home_cost = (L - w) * X * lc.compute_s - home_value
        out.append((home_cost + win.cost_s(lc, rows), w, win))
    return out


def _home_levels(spec: JobSpec, sol: Solution, home_layers: int, units: int) -> list[list[int]]:
    if spec.overrides.level is None:
        return sol.levels(home_layers)
    return [[spec.overrides.level] * units for _ in range(home_layers)]


def finish(
    dims: ModelDims,
    spec: JobSpec,
    node: NodeProfile,
    lay: mm.Layout,
    sol: Solution,
    window: int,
    window_rows: list[list[int]],
    device: str,
    first_sol: Solution | None = None,
) -> Candidate | None:
    """The candidate at `window`: home levels from `sol` (with overlap, the later passes';
    the first pass's from `first_sol`), cut to the host budget, its bytes and its time."""
    L, X = dims.num_layers, lay.units
    saved = mm.saved_bytes_by_level(dims, spec, lay.seq_chunk)
    inputs_home = (L - window) * X * saved[0]
    if mm.host_bytes(dims, spec, inputs_home, device, lay=lay) > spec.budget.host_bytes:
        return None  # even level 0 everywhere does not fit the host
    home = _home_levels(spec, sol, L - window, X)
    if first_sol is not None:
        return _finish_overlap(dims, spec, node, lay, first_sol, window, window_rows, device, home)
    home_saved = sum(saved[lv] for row in home for lv in row)  # one rank's
    window_inputs = window * X * saved[1]  # a lead pass's window chunks go home at level 1
    # Over the host budget: step home chunks down, the least recomputation per byte freed
    # first; each step frees its bytes in every rank's store (host_bytes counts the store
    # per rank), and a lead pass's extra rounds' copies with them
    limit = mm.home_saved_limit(dims, spec, device, home_saved, lay, window_inputs)
    if home_saved > limit:
        for k, c, level, freed in cheapest_drops(cm.layer_cost(dims, spec, lay, node), home, saved):
            home[k][c] = level
            home_saved -= freed
            if home_saved <= limit:
                break
        if home_saved > limit:
            return None  # a lead pass's sets do not fit even at level 0
    extra = mm.lead_pass_saved(lay, home_saved, window_inputs)
    host = mm.host_bytes(dims, spec, home_saved + extra, device, lay=lay)
    levels = home + window_rows
    if lay.optimizer == "split":  # as many device layers as suit what the layers send home
        sent = cm.first_forward_sent(dims, spec, lay, home)
        lay = replace(lay, device_layers=cm.split_layers(dims, spec, lay, sent, node, device))
    kept = mm.saved_bytes_by_level(dims, spec, lay.seq_chunk, home=False)
    window_saved = sum(kept[lv] for row in window_rows for lv in row)
    dev = mm.device_bytes(dims, spec, lay, window, window_saved)
    if dev > spec.budget.device_bytes:
        return None
    time = cm.step_time(dims, spec, lay, levels, window, node, device)
    return Candidate(lay, window, time, levels, dev, host)


def _finish_overlap(
    dims: ModelDims,
    spec: JobSpec,
    node: NodeProfile,
    lay: mm.Layout,
    first_sol: Solution,
    window: int,
    window_rows: list[list[int]],
    device: str,
    home: list[list[int]],
) -> Candidate | None:
    """An overlap candidate: the first pass at its own levels, the later passes at `home`;
    one host store, each layer's sets released as its backward ends. Where they
    do not fit the host budget it is dropped, levels not cut, and the search goes on to the
    next candidate (another window or layout)."""
    L, X = dims.num_layers, lay.units
    saved = mm.saved_bytes_by_level(dims, spec, lay.seq_chunk)
    first = _home_levels(spec, first_sol, L - window, X)
    # each layer's home bytes: the first pass's with its lead rounds' (a lead pass's window
    # chunks past the first round's go home at level 1: memory_model.lead_pass_saved)
    first_sent = [lay.lead_rounds * sum(saved[lv] for lv in row) for row in first]
    first_sent += [(lay.lead_rounds - 1) * X * saved[1]] * window
    later_sent = [sum(saved[lv] for lv in row) for row in home] + [0] * window
    # the store rounds each tensor to 256 bytes: 1/256 more covers tensors of 64 KiB and up
    # (at 8K tokens every tensor is a multiple of 256 already)
    stored = mm.overlap_stored_bytes(
        [b + b // 256 for b in first_sent], [b + b // 256 for b in later_sent]
    )
    host = mm.host_bytes(dims, spec, 0, device, stored=stored, lay=lay)
    if host > spec.budget.host_bytes:
        return None
    if lay.optimizer == "split":
        sent = cm.first_forward_sent(dims, spec, lay, first)
        lay = replace(lay, device_layers=cm.split_layers(dims, spec, lay, sent, node, device))
    kept = mm.saved_bytes_by_level(dims, spec, lay.seq_chunk, home=False)
    dev = mm.device_bytes(dims, spec, lay, window, sum(kept[lv] for r in window_rows for lv in r))
    if dev > spec.budget.device_bytes:
        return None
    levels, first_levels = home + window_rows, first + window_rows
    time = cm.step_time(dims, spec, lay, levels, window, node, device, first_levels)
    return Candidate(lay, window, time, levels, dev, host, first_levels)
