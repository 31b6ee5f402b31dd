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
   levels come from one pass of the DP (planning/levels.py) that answers for every W; the
   window's levels are bought with the device memory left over;
4. the candidate with the smallest predicted step (planning/cost_model.py) wins.
Every candidate fits the device budget by construction: more budget only adds candidates,
never a slower prediction within a tier of step 1 (the budget that first admits the bound's
micro-batch may predict slower than the one below: that tier keeps the weight stream hidden
by design). Long sequences (seq_len >= PIECES_FROM_TOKENS) weigh pieces (and their window
on the host) beside whole sequences in one search; shorter ones take pieces as a second
tier where no whole-sequence plan fits (measured slower than predicted).
"""

from __future__ import annotations

from dataclasses import replace

from wstrain.contracts.calibration import WRITE_BUFFER_BYTES
from wstrain.contracts.errors import InvalidSpec
from wstrain.contracts.hardware import Device, NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.plan import Plan, Predicted, WorkingSetPlan
from wstrain.contracts.spec import JobSpec
from wstrain.planning import cost_model as cm
from wstrain.planning import memory_model as mm
from wstrain.planning import spill as sp
from wstrain.planning.candidates import Candidate, Window, finish, window_costs
from wstrain.planning.layouts import PIECES_FROM_TOKENS, WRITE_BUFFER_GAIN, layouts, micro_batches
from wstrain.planning.levels import Solution, solve
from wstrain.planning.reasons import ws_reasons
from wstrain.planning.refusal import host_over_bytes, infeasible, may_spill

# Predicted steps this close are one speed: equal costs summed in another order differ by
# float rounding (1e-15 s), the cost model's resolution is milliseconds.
TIE_S = 1e-6


def _search(
    spec: JobSpec,
    dims: ModelDims,
    whole: NodeProfile,
    device: str,
    mbs: list[int],
    pieces: bool,
    spilled: int = 0,
) -> Candidate | None:
    """The fastest candidate over micro-batches `mbs`, whole sequences or (`pieces`) in
    pieces too, with `spilled` layers' moments on disk; a layout in pieces is costed at its
    piece kernel's attention rate."""
    in_pieces = whole.for_piece_kernel(_piece_kernel(spec, dims, whole, device))
    whole = whole.for_piece_kernel(_whole_kernel(spec, dims, whole, device))
    ranked: list[tuple[float, int, mm.Layout, Solution, int, Window, Solution | None]] = []
    # the DP depends on the units, whether a backward runs beside the forward, and the
    # write buffer (its cap)
    solutions: dict[tuple[int, int, bool, int], tuple[cm.LayerCost, Solution]] = {}

    def node_for(lay: mm.Layout) -> NodeProfile:
        return in_pieces if lay.pieces > 1 else whole

    def solved(lay: mm.Layout) -> tuple[cm.LayerCost, Solution]:
        key = (lay.micro_batch, lay.seq_chunk, lay.overlap, lay.write_buffer_bytes)
        if key not in solutions:
            lc = cm.layer_cost(dims, spec, lay, node_for(lay))
            solutions[key] = (lc, solve([lc] * dims.num_layers))
        return solutions[key]

    for i, lay in enumerate(layouts(spec, dims, mbs, pieces, device, spilled)):
        node = node_for(lay)
        lc, sol = solved(lay)
        rounds = spec.global_batch // lay.micro_batch
        base = cm.step_time(dims, spec, lay, [], 0, node, device)  # compute, fwd, optimizer
        if not lay.overlap:
            for cost, w, win in window_costs(dims, spec, lay, sol, lc):
                ranked.append(
                    (weighed(lay, base.total_s + rounds * cost), i, lay, sol, w, win, None)
                )
            continue
        # overlap: the first pass (its lead rounds) alone, the later rounds beside a backward,
        # one window for both
        lc_first, sol_first = solved(replace(lay, overlap=False))
        first = {w: cost for cost, w, _ in window_costs(dims, spec, lay, sol_first, lc_first)}
        lead = lay.lead_rounds
        for cost, w, win in window_costs(dims, spec, lay, sol, lc):
            if w in first:
                est = base.total_s + lead * first[w] + (rounds - lead) * cost
                ranked.append((weighed(lay, est), i, lay, sol, w, win, sol_first))
    # The fastest estimate first; estimates within TIE_S of the fastest are one speed (many
    # windows cost the same but for float rounding) and go to the earlier layout (deeper
    # rings, larger loss block), then the wider window (fewer fetches, less host). An
    # estimate assumes the DP's levels all fit the host; where _finish must drop some to
    # level 0 the candidate gets slower, so later ones are tried until no estimate can
    # beat the best finished candidate by TIE_S (the estimate never exceeds the finished
    # time).
    ranked.sort(key=lambda r: (r[0], r[1], -r[4]))
    tied = sum(r[0] <= ranked[0][0] + TIE_S for r in ranked) if ranked else 0
    ranked[:tied] = sorted(ranked[:tied], key=lambda r: (r[1], -r[4]))
    best: Candidate | None = None
    for est, _, lay, sol, w, win, first_sol in ranked:
        if best is not None and est >= weighed(best.lay, best.time.total_s) - TIE_S:
            break
        cand = finish(dims, spec, node_for(lay), lay, sol, w, win.rows(), device, first_sol)
        if cand is not None and (
            best is None
            or weighed(cand.lay, cand.time.total_s) < weighed(best.lay, best.time.total_s) - TIE_S
        ):
            best = cand
    return best


def weighed(lay: mm.Layout, step_s: float) -> float:
    """A candidate's step time as the search ranks it: a write buffer past the default
    must buy WRITE_BUFFER_GAIN of speed."""
    return (
        step_s * (1 + WRITE_BUFFER_GAIN) if lay.write_buffer_bytes > WRITE_BUFFER_BYTES else step_s
    )


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
    if spec.overrides.overlap and (
        dims.is_moe or spec.global_batch < 2 or spec.overrides.seq_chunk
    ):
        raise InvalidSpec(
            "overrides.overlap=true runs a round's forward beside the previous round's "
            "backward: it needs a dense model, whole sequences and two rounds (here "
            f"global_batch={spec.global_batch}, seq_chunk={spec.overrides.seq_chunk}, "
            f"{'a mixture of experts' if dims.is_moe else 'dense'}); drop overlap"
        )
    piece = spec.overrides.seq_chunk
    if piece and piece < spec.seq_len and (dims.is_moe or (lead or 1) > 1):
        raise InvalidSpec(
            f"overrides.seq_chunk={piece}: long context in pieces runs dense models, one "
            "round a pass; drop seq_chunk (or lead_rounds)"
        )
    tiers, bound = micro_batches(spec, dims, node)
    # shorter sequences try whole ones first (PIECES_FROM_TOKENS), then pieces
    passes = [True] if spec.seq_len >= PIECES_FROM_TOKENS else [False, True]
    mbs = [m for tier in tiers for m in tier]
    best = _first_fit(spec, dims, node, device, tiers, passes, 0)
    if best is None:  # the state past the host budget: its coldest part to disk, if it may
        counts = _spill_counts(spec, dims, node, device, mbs)
        fits = [_first_fit(spec, dims, node, device, tiers, passes, n) for n in counts]
        best = min((c for c in fits if c), key=lambda c: c.time.total_s, default=None)
    if best is None:
        raise infeasible(spec, dims, node, device, mbs)
    return _plan(spec, dims, node, best, device, bound)


def _first_fit(
    spec: JobSpec,
    dims: ModelDims,
    node: NodeProfile,
    device: str,
    tiers: list[list[int]],
    passes: list[bool],
    spilled: int,
) -> Candidate | None:
    """The fastest candidate of the first tier (and pass) where one fits."""
    for tier, pieces in ((t, p) for p in passes for t in tiers):
        best = _search(spec, dims, node, device, tier, pieces, spilled)
        if best is not None:
            return best
    return None


def _spill_counts(
    spec: JobSpec, dims: ModelDims, node: NodeProfile, device: str, mbs: list[int]
) -> list[int]:
    """The spill counts to search: none without a disk budget, a spill directory on the
    node (its profiled rates) or on several ranks (each would stream its span: not built)."""
    if not spec.budget.disk_bytes or node.disk_read_bytes_per_s <= 0 or not may_spill(spec):
        return []
    most = sp.most_spilled(dims, spec.precision, spec.budget.disk_bytes)
    over = max(1, host_over_bytes(spec, dims, device))  # a plan failed: spill one at least
    least = sp.least_spilled(dims, spec.precision, over, most)
    return [] if least is None else sp.spill_counts(least, most)


def _piece_kernel(spec: JobSpec, dims: ModelDims, node: NodeProfile, device: str) -> str:
    return node.piece_kernel(device, spec.precision, spec.document_mask, dims.head_dim)


def _whole_kernel(spec: JobSpec, dims: ModelDims, node: NodeProfile, device: str) -> str:
    return node.whole_kernel(device, spec.precision, spec.document_mask, dims.head_dim)


def _plan(
    spec: JobSpec, dims: ModelDims, node: NodeProfile, c: Candidate, device: Device, bound: float
) -> Plan:
    L, lay = dims.num_layers, c.lay
    kernel = (_piece_kernel if lay.pieces > 1 else _whole_kernel)(spec, dims, node, device)
    node = node.for_piece_kernel(kernel)
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
            peak_disk_bytes=sp.disk_bytes(dims, spec.precision, lay.spilled_layers),
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
            window_home=lay.window_home,
            attention_kernel=kernel,
            overlap=lay.overlap,
            first_levels=c.first_levels or [],
            spilled_layers=lay.spilled_layers,
            write_buffer_bytes=lay.write_buffer_bytes,
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
