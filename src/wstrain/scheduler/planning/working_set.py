"""The autoconfigurator for the working-set runtime: from (model, seq_len, global batch,
budgets, node profile) to a Plan that fits and is the fastest the cost model knows.

    plan = make_ws_plan(spec, dims, node)     # InfeasibleBudget names the smallest budgets

The search (AdaWS §3.2 with ProTrain's "try them all, the cost model picks"):
1. micro-batch: from AdaWS's bound X >= (|τp|+|τg|)·ψ·P / (2·S·(ψ_active + S·d_attn)·BW)
   up, over divisors of the global batch (rounds = global_batch / X); below the bound only
   when none at or above it fits the budget (or the global batch is smaller);
2. per micro-batch, ring sizes, device, host or split AdamW (the split point is chosen
   once the levels are known) and the LM-head block (layouts);
3. per layout every window W <= (C_dev - B) / L_bytes; the home layers' saved-activation
   levels come from one pass of the DP (scheduler/planning/levels.py) that answers for every W; the
   window's levels are bought with the device memory left over;
4. the candidate with the smallest predicted step (scheduler/planning/cost_model.py) wins.
Every candidate fits the device budget by construction, so more budget only adds candidates:
a bigger budget never predicts a slower step within a tier of step 1. The budget that first
admits a micro-batch at the bound can predict a slower step than the smaller one below it
did: the bound's tier wins by design (it keeps the weight stream hidden behind compute).
Long sequences (seq_len >= PIECES_FROM_TOKENS) weigh pieces beside whole sequences in
one search; shorter ones take pieces as a second tier, only where no whole-sequence plan
fits (measured slower than predicted), so there too the budget that first admits whole
sequences may predict a slower step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from wstrain.scheduler.contracts.calibration import GIB, LEVELS
from wstrain.scheduler.contracts.errors import InfeasibleBudget, InvalidSpec
from wstrain.scheduler.contracts.hardware import Device, NodeProfile, piece_attention_kernel
from wstrain.scheduler.contracts.model_dims import ModelDims
from wstrain.scheduler.contracts.plan import MinBudget, Plan, Predicted, WorkingSetPlan
from wstrain.scheduler.contracts.spec import JobSpec
from wstrain.scheduler.planning import cost_model as cm
from wstrain.scheduler.planning import memory_model as mm
from wstrain.scheduler.planning.layouts import (
    PIECES_FROM_TOKENS,
    layouts,
    micro_batches,
    seq_chunks,
)
from wstrain.scheduler.planning.levels import LayerCost, Solution, cheapest_drops, solve
from wstrain.scheduler.planning.reasons import ws_reasons


@dataclass(frozen=True)
class _Candidate:
    lay: mm.Layout
    window: int
    time: cm.StepTime
    levels: list[list[int]]
    device_bytes: int
    host_bytes: int
    first_levels: list[list[int]] | None = None  # with overlap: the step's first pass's


@dataclass(frozen=True)
class _Window:
    """Window levels bought with spare device memory, as counts over the window's chunks in
    backward order (last layer first, a layer's last chunk first: a sequence's last pieces
    are worth the most): `top` at level 3, then up to `n` at `level`."""

    layers: int
    chunks: int
    level: int = 0
    n: int = 0
    top: int = 0

    def rows(self) -> list[list[int]]:
        flat = [3] * self.top + [self.level] * (self.n - self.top)
        flat += [0] * (self.layers * self.chunks - self.n)
        X = self.chunks
        return [flat[i * X : (i + 1) * X][::-1] for i in range(self.layers)][::-1]

    def cost_s(self, lc: LayerCost) -> float:
        """Per round: recomputation left in the window plus its exposed backward transfer
        (rows wholly at one level are counted in bulk; at most two rows are mixed)."""
        X = self.chunks
        rec = [lc.compute_s - v for v in lc.value_s]

        def row(n3: int, nl: int) -> float:  # as rows() lays it out: level 3 last
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


def _fill_window(window: int, lc: LayerCost, saved: list[int], spare_bytes: float) -> _Window:
    """The best value per byte first, then level 3, last layers first (backward meets them
    first)."""
    X = lc.chunks
    extra = [b - saved[0] for b in saved]
    best = max(range(1, LEVELS), key=lambda lv: lc.value_s[lv] / max(extra[lv], 1))
    n_best = int(min(window * X, max(0.0, spare_bytes) // max(extra[best], 1)))
    spare_bytes -= n_best * extra[best]
    n_top = 0
    if best != 3 and lc.value_s[3] > lc.value_s[best]:
        n_top = int(min(n_best, max(0.0, spare_bytes) // max(extra[3] - extra[best], 1)))
    return _Window(window, X, best, n_best, n_top)


def window_costs(
    dims: ModelDims, spec: JobSpec, lay: mm.Layout, sol: Solution, lc: LayerCost
) -> list[tuple[float, int, _Window]]:
    """(per-round recomputation + exposed backward transfer, window, window levels) for
    every window this layout fits."""
    L, X, forced = dims.num_layers, lay.units, spec.overrides.level
    windows = [spec.overrides.window] if spec.overrides.window is not None else range(L + 1)
    saved = [mm.saved_bytes(dims, spec, lv, lay.seq_chunk, home=False) for lv in range(LEVELS)]
    forced_value = None if forced is None else float(lc.pattern_value(np.full((1, X), forced))[0])
    out = []
    for w in windows:
        spare = mm.spare_window_bytes(dims, spec, lay, w)
        if spare < 0:
            continue
        if forced is None:
            home_value = sol.best_s(L - w)
            win = _fill_window(w, lc, saved, spare)
        else:
            if w * X * (saved[forced] - saved[0]) > spare:
                continue
            assert forced_value is not None  # set whenever `forced` is
            home_value, win = (L - w) * forced_value, _Window(w, X, forced, w * X)
        if home_value == float("-inf"):
            continue
        home_cost = (L - w) * X * lc.compute_s - home_value
        out.append((home_cost + win.cost_s(lc), w, win))
    return out


def _home_levels(spec: JobSpec, sol: Solution, home_layers: int, units: int) -> list[list[int]]:
    if spec.overrides.level is None:
        return sol.levels(home_layers)
    return [[spec.overrides.level] * units for _ in range(home_layers)]


def _finish(
    dims: ModelDims,
    spec: JobSpec,
    node: NodeProfile,
    lay: mm.Layout,
    sol: Solution,
    window: int,
    window_rows: list[list[int]],
    device: str,
    first_sol: Solution | None = None,
) -> _Candidate | None:
    """The candidate at `window`: home levels from `sol` (with overlap, the later passes';
    the first pass's from `first_sol`), cut to the host budget, its bytes and its time."""
    L, X = dims.num_layers, lay.units
    saved = [mm.saved_bytes(dims, spec, lv, lay.seq_chunk) for lv in range(LEVELS)]
    if mm.host_bytes(dims, spec, (L - window) * X * saved[0], device) > spec.budget.host_bytes:
        return None  # even level 0 everywhere does not fit the host
    home = _home_levels(spec, sol, L - window, X)
    home_saved = sum(saved[lv] for row in home for lv in row)  # one rank's
    window_inputs = window * X * saved[1]  # a lead pass's window chunks go home at level 1
    if first_sol is not None:
        return _finish_overlap(dims, spec, node, lay, first_sol, window, window_rows, device, home)
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
    host = mm.host_bytes(dims, spec, home_saved + extra, device)
    levels = home + window_rows
    if lay.optimizer == "split":  # as many device layers as suit what the layers send home
        sent = cm.first_forward_sent(dims, spec, lay, home)
        lay = replace(lay, device_layers=cm.split_layers(dims, spec, lay, sent, node, device))
    kept = [mm.saved_bytes(dims, spec, lv, lay.seq_chunk, home=False) for lv in range(LEVELS)]
    window_saved = sum(kept[lv] for row in window_rows for lv in row)
    dev = mm.device_bytes(dims, spec, lay, window, window_saved)
    if dev > spec.budget.device_bytes:
        return None
    time = cm.step_time(dims, spec, lay, levels, window, node, device)
    return _Candidate(lay, window, time, levels, dev, host)


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
) -> _Candidate | None:
    """An overlap candidate: the first pass at its own levels, the later passes at `home`;
    two host stores (each pass's sets stay until its backward takes them back). Where they
    do not fit the host budget the per-round candidates stand instead."""
    L, X = dims.num_layers, lay.units
    saved = [mm.saved_bytes(dims, spec, lv, lay.seq_chunk) for lv in range(LEVELS)]
    first = _home_levels(spec, first_sol, L - window, X)
    first_saved, later_saved = (sum(saved[lv] for row in h for lv in row) for h in (first, home))
    first_saved += mm.lead_pass_saved(lay, first_saved, window * X * saved[1])
    stored = mm.overlap_stored_bytes(first_saved, later_saved)
    host = mm.host_bytes(dims, spec, 0, device, stored=stored)
    if host > spec.budget.host_bytes:
        return None
    if lay.optimizer == "split":
        sent = cm.first_forward_sent(dims, spec, lay, first)
        lay = replace(lay, device_layers=cm.split_layers(dims, spec, lay, sent, node, device))
    kept = [mm.saved_bytes(dims, spec, lv, lay.seq_chunk, home=False) for lv in range(LEVELS)]
    dev = mm.device_bytes(dims, spec, lay, window, sum(kept[lv] for r in window_rows for lv in r))
    if dev > spec.budget.device_bytes:
        return None
    levels, first_levels = home + window_rows, first + window_rows
    time = cm.step_time(dims, spec, lay, levels, window, node, device, first_levels)
    return _Candidate(lay, window, time, levels, dev, host, first_levels)


def _search(
    spec: JobSpec, dims: ModelDims, node: NodeProfile, device: str, mbs: list[int], pieces: bool
) -> _Candidate | None:
    ranked: list[tuple[float, int, mm.Layout, Solution, int, _Window, Solution | None]] = []
    # the DP depends on the units and whether a backward runs beside the forward alone
    solutions: dict[tuple[int, int, bool], tuple[cm.LayerCost, Solution]] = {}

    def solved(lay: mm.Layout) -> tuple[cm.LayerCost, Solution]:
        key = (lay.micro_batch, lay.seq_chunk, lay.overlap)
        if key not in solutions:
            lc = cm.layer_cost(dims, spec, lay, node)
            solutions[key] = (lc, solve([lc] * dims.num_layers))
        return solutions[key]

    for i, lay in enumerate(layouts(spec, dims, mbs, pieces)):
        lc, sol = solved(lay)
        rounds = spec.global_batch // lay.micro_batch
        base = cm.step_time(dims, spec, lay, [], 0, node, device)  # compute, fwd, optimizer
        if not lay.overlap:
            for cost, w, win in window_costs(dims, spec, lay, sol, lc):
                ranked.append((base.total_s + rounds * cost, i, lay, sol, w, win, None))
            continue
        # overlap: the first pass (its lead rounds) alone, the later rounds beside a backward,
        # one window for both
        lc_first, sol_first = solved(replace(lay, overlap=False))
        first = {w: cost for cost, w, _ in window_costs(dims, spec, lay, sol_first, lc_first)}
        lead = lay.lead_rounds
        for cost, w, win in window_costs(dims, spec, lay, sol, lc):
            if w in first:
                est = base.total_s + lead * first[w] + (rounds - lead) * cost
                ranked.append((est, i, lay, sol, w, win, sol_first))
    # The fastest estimate first; ties go to the earlier layout (deeper rings, larger loss
    # block). An estimate assumes the DP's levels all fit the host; where _finish must drop
    # some to level 0 the candidate gets slower, so later ones are tried until no estimate
    # can beat the best finished candidate (the estimate never exceeds the finished time).
    best: _Candidate | None = None
    for est, _, lay, sol, w, win, first_sol in sorted(ranked, key=lambda r: (r[0], r[1], -r[4])):
        if best is not None and est >= best.time.total_s * (1 - 1e-9):
            break
        cand = _finish(dims, spec, node, lay, sol, w, win.rows(), device, first_sol)
        if cand is not None and (best is None or cand.time.total_s < best.time.total_s):
            best = cand
    return best


def make_ws_plan(spec: JobSpec, dims: ModelDims, node: NodeProfile) -> Plan:
    if spec.precision == "mixed" and spec.overrides.optimizer not in (None, "host"):
        raise InvalidSpec(
            f'precision="mixed" updates its fp32 master on the host; '
            f'overrides.optimizer="{spec.overrides.optimizer}" needs precision '
            '"bf16" (or use "host")'
        )
    device = spec.overrides.device or node.device
    if spec.overrides.micro_batch and spec.global_batch % spec.overrides.micro_batch:
        raise InvalidSpec(
            f"overrides.micro_batch={spec.overrides.micro_batch} must divide "
            f"global_batch={spec.global_batch}"
        )
    lead = spec.overrides.lead_rounds
    if lead and lead > 1 and dims.is_moe:
        raise InvalidSpec(
            f"overrides.lead_rounds={lead}: lead passes are for dense models; a "
            "mixture-of-experts model trains with lead_rounds 1"
        )
    if lead and lead > spec.global_batch // (spec.overrides.micro_batch or 1):
        raise InvalidSpec(
            f"overrides.lead_rounds={lead} exceeds the step's rounds "
            f"(global_batch / micro_batch); lower it or the micro-batch"
        )
    if spec.overrides.optimizer == "split" and dims.num_layers < 2:
        raise InvalidSpec(
            'overrides.optimizer="split" needs at least two layers to split; use "host" or "device"'
        )
    if spec.overrides.window is not None and spec.overrides.window > dims.num_layers:
        raise InvalidSpec(
            f"overrides.window={spec.overrides.window} exceeds the model's {dims.num_layers} layers"
        )
    if spec.overrides.overlap and (dims.is_moe or spec.global_batch < 2):
        raise InvalidSpec(
            "overrides.overlap=true runs a round's forward beside the previous round's "
            f"backward: it needs a dense model and two rounds (global_batch="
            f"{spec.global_batch}{', a mixture of experts' if dims.is_moe else ''}); drop it"
        )
    piece = spec.overrides.seq_chunk
    if piece and piece < spec.seq_len and (dims.is_moe or (lead or 1) > 1):
        raise InvalidSpec(
            f"overrides.seq_chunk={piece}: long context in pieces runs dense models, one "
            "round a pass; drop seq_chunk (or lead_rounds)"
        )
    tiers, bound = micro_batches(spec, dims, node)
    best = None
    # shorter sequences try whole ones first (PIECES_FROM_TOKENS), then pieces
    passes = [True] if spec.seq_len >= PIECES_FROM_TOKENS else [False, True]
    for tier, pieces in ((t, p) for p in passes for t in tiers):
        best = _search(spec, dims, node, device, tier, pieces)
        if best is not None:
            break
    else:
        raise _infeasible(spec, dims, device, [m for tier in tiers for m in tier])
    return _plan(spec, dims, node, best, device, bound)


def _infeasible(spec: JobSpec, dims: ModelDims, device: str, mbs: list[int]) -> InfeasibleBudget:
    smallest = [
        mm.Layout(min(mbs), 2, 1, "host", 512, seq_chunk=c, pieces=p)
        for c, p in seq_chunks(spec, dims)
    ]
    inputs_home = dims.num_layers * min(mbs) * mm.saved_bytes(dims, spec, 0)
    need = MinBudget(
        device_gib=round(
            min(
                mm.device_bytes(
                    dims,
                    spec,
                    lay,
                    w,
                    w * lay.units * mm.saved_bytes(dims, spec, 0, lay.seq_chunk, home=False),
                )
                for lay in smallest
                for w in (0, dims.num_layers)
            )
            / GIB
            + 0.005,
            2,
        ),
        host_gib=round(mm.host_bytes(dims, spec, inputs_home, device) / GIB + 0.005, 2),
    )
    return InfeasibleBudget(
        f"budget device_gib={spec.budget.device_gib}, host_gib={spec.budget.host_gib} cannot "
        f"hold {dims.params / 1e6:.1f}M parameters at seq_len={spec.seq_len} even with the "
        f"working-set runtime; raise the budget to at least device_gib={need.device_gib}, "
        f"host_gib={need.host_gib}",
        min_budget=need.model_dump(),
    )


def _plan(
    spec: JobSpec, dims: ModelDims, node: NodeProfile, c: _Candidate, device: Device, bound: float
) -> Plan:
    L, lay = dims.num_layers, c.lay
    return Plan(
        runtime="working_set",
        device=device,
        micro_batch=lay.micro_batch,
        rounds=spec.global_batch // lay.micro_batch,
        window=c.window,
        layers=L,
        params=dims.params,
        predicted=Predicted(
            step_seconds=c.time.total_s,
            peak_device_bytes=c.device_bytes,
            peak_host_bytes=c.host_bytes,
            compute_seconds=c.time.compute_s,
            recompute_seconds=c.time.recompute_s,
            exposed_transfer_seconds=c.time.exposed_transfer_s,
            optimizer_seconds=c.time.optimizer_s,
        ),
        working_set=WorkingSetPlan(
            chunk=1,
            r_param=lay.r_param,
            r_grad=lay.r_grad,
            levels=c.levels,
            loss_tokens=min(lay.loss_tokens, spec.seq_len),
            optimizer=lay.optimizer,
            device_layers=lay.device_layers,
            lead_rounds=lay.lead_rounds,
            seq_chunk=lay.seq_chunk if lay.pieces > 1 else 0,
            attention_kernel=piece_attention_kernel(device, spec.precision, spec.document_mask)
            if lay.pieces > 1
            else "",
            overlap=lay.overlap,
            first_levels=c.first_levels or [],
        ),
        reasons=ws_reasons(
            spec,
            dims,
            node,
            c.lay,
            c.window,
            c.levels,
            c.time,
            c.device_bytes,
            c.host_bytes,
            device,
            bound,
        ),
    )
