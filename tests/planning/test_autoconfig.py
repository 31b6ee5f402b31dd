"""The autoconfigurator (planning/working_set.py, cost_model.py, levels.py) on synthetic
hardware profiles: AdaWS's own worked numbers, and invariants as properties over random
models, budgets and profiles."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.helpers.specs import working_set_spec as _spec
from wstrain.contracts.calibration import GIB, LEVELS
from wstrain.contracts.errors import InfeasibleBudget, InvalidSpec
from wstrain.contracts.hardware import H100_ADAWS, H200, NodeProfile
from wstrain.contracts.model_dims import PRESETS, ModelDims
from wstrain.planning import layer_time
from wstrain.planning.layouts import PIECES_FROM_TOKENS, micro_batches
from wstrain.planning.levels import BUCKETS, LayerCost, simulate, solve
from wstrain.planning.planner import make_plan
from wstrain.planning.working_set import make_ws_plan

LLAMA3_8B = PRESETS["llama3-8b"]

# Only a hang takes this long: a plan takes 10-75 ms (bench/planner.py), so no machine's
# speed, CI's included, decides these tests.
HANG_S = 60.0


# ---------------------------------------------------------------- AdaWS's worked numbers


def test_adaws_micro_batch_bound_for_llama3_8b_on_h100() -> None:
    """AdaWS §3.2.2 on its own inputs: H100 at P = 989 TFLOP/s, PCIe 5 at 64 GB/s, bf16
    weights and gradients (|τp| = |τg| = 2). Llama3-8B layer: ψ = 2·4096·4096 (q, o) +
    2·4096·1024 (k, v) + 3·4096·14336 (MLP) + 2·4096 (norms) = 218,112,000; d_attn = 4096.
      S = 8192:  X >= 4·218112000·989e12 / (2·8192·(218112000 + 8192·4096)·64e9) = 3.2697
      S = 4096:  ... / (2·4096·(218112000 + 4096·4096)·64e9)  = 7.0064
      S = 32768: ... / (2·32768·(218112000 + 32768·4096)·64e9) = 0.5839"""
    assert LLAMA3_8B.layer_params == 218_112_000
    for seq, expected in ((8192, 3.2697), (4096, 7.0064), (32768, 0.5839)):
        x = layer_time.adaws_min_micro_batch(
            218_112_000, 218_112_000, seq, 4096, 2, 2, 989e12, 64e9
        )
        assert x == pytest.approx(expected, rel=1e-4)
    # The planner takes the first divisor of the global batch at or above the bound.
    for seq, first in ((8192, 4), (4096, 8), (32768, 1)):
        spec = _spec(LLAMA3_8B, seq, 64, 60, 400, optimizer="host", r_param=3, r_grad=2)
        plan = make_ws_plan(spec, LLAMA3_8B, H100_ADAWS)
        bound = layer_time.adaws_min_micro_batch(
            218_112_000, 218_112_000, seq, 4096, 2, 2, 989e12, 64e9
        )
        assert f"X >= {bound:.2f}" in plan.reasons["micro_batch"]
        assert plan.micro_batch >= first


def test_adaws_micro_batch_bound_uses_total_and_active_params_for_moe() -> None:
    """OLMoE-7Bx1B (Table 1): d = 2048, 16 heads of 128, 16 KV heads, 64 experts of 1024,
    top-8. ψ_total = 2·2048·2048 + 2·2048·2048 + 64·3·2048·1024 + 2048·64 + 2·2048 =
    419,565,568; ψ_active swaps 64 experts for 8: 67,244,032. At S = 8192:
    X >= 4·419565568·989e12 / (2·8192·(67244032 + 8192·2048)·64e9) = 18.839 sequences:
    streaming all experts' weights needs far more tokens than the active FLOPs of a dense
    layer of the same compute."""
    x = layer_time.adaws_min_micro_batch(419_565_568, 67_244_032, 8192, 2048, 2, 2, 989e12, 64e9)
    assert x == pytest.approx(18.839, rel=1e-4)
    # the preset adds OLMoE's q/k RMSNorms over whole projections (2 x 2048), and the
    # planner's bound takes ψ_total and ψ_active from it
    olmoe = PRESETS["olmoe-7b-a1b"]
    assert (olmoe.layer_params, olmoe.layer_params_active) == (419_569_664, 67_248_128)
    spec = _spec(olmoe, 8192, 180, 20, 100)
    tiers, bound = micro_batches(spec, olmoe, H100_ADAWS)  # 989 TFLOP/s, 64 GB/s
    assert bound == pytest.approx(18.839, rel=1e-4)
    assert tiers[0][0] == 20  # the first divisor of 180 at or above the bound


def test_window_is_adaws_formula_with_every_fixed_buffer() -> None:
    """W = (C_dev - B) / L_bytes for Llama3-8B, X = 4 at S = 8192, C_dev = 20 GiB; tensors
    allocated once count exactly, what is allocated per layer takes the allocator slack
    1.18. B, by hand (bf16):
      embedding + LM head, weights + grads  4·525,336,576·2 + 2·4096·2   = 4,202,708,992
      rings: 3 weight + 2 gradient slots    5·218,112,000·2             = 2,181,120,000
    and 1.18 times
      transition table                      4·8192·4096·2               =   268,435,456
      chunked-loss block (2048 tokens)      2048·128256·(2 + 8)         = 2,626,682,880
      kernel workspace                      1.3·200,704·8192            = 2,137,417,318
      write buffer                          1 GiB                       = 1,073,741,824
      the attention block's weight gradients
      (levels 0, 2; the MLP's accumulate in
      place)                                41,951,232·2                =    83,902,464
      reserve                               0.5 GiB                     =   536,870,912
                                                                          6,727,050,854
    L_bytes (level-0 window layer) = 4·8192·4096·2 = 268,435,456.
    W = floor((20 GiB - 14,321,748,999) / 268,435,456) = floor(26.65) = 26."""
    moving = 268_435_456 + 2_626_682_880 + 2_137_417_318 + 1_073_741_824 + 83_902_464 + 536_870_912
    assert moving == 6_727_050_854
    B = int(4_202_708_992 + 2_181_120_000 + 1.18 * moving)
    assert B == 14_321_748_999
    expected = int((20 * GIB - B) // 268_435_456)
    assert expected == 26
    spec = _spec(
        LLAMA3_8B,
        8192,
        32,
        20,
        400,
        micro_batch=4,
        r_param=3,
        r_grad=2,
        level=0,
        optimizer="host",
        lead_rounds=1,
    )
    plan = make_ws_plan(spec, LLAMA3_8B, H100_ADAWS)
    # With level 0 forced, a wider window costs nothing and saves fetches: W is the bound.
    assert plan.window == expected
    assert plan.predicted.peak_device_bytes <= 20 * GIB


# ---------------------------------------------------------------- the DP


@st.composite
def layer_costs(draw: st.DrawFn) -> LayerCost:
    compute, cap = draw(st.floats(0.5, 2.0)), draw(st.floats(0.5, 6.0))
    transfer = sorted(draw(st.lists(st.floats(0.0, 4.0), min_size=LEVELS, max_size=LEVELS)))
    transfer[0] = min(transfer[0], compute, cap)  # inputs alone fit the link
    value = sorted(
        draw(st.lists(st.floats(0.0, compute), min_size=LEVELS - 1, max_size=LEVELS - 1))
    )
    return LayerCost(draw(st.integers(1, 4)), compute, tuple(transfer), (0.0, *value), cap)


@settings(max_examples=200, deadline=None)
@given(lc=layer_costs(), layers=st.integers(1, 12), other=layer_costs())
def test_dp_never_violates_the_write_buffer_constraint(
    lc: LayerCost, layers: int, other: LayerCost
) -> None:
    transfer = (min(other.transfer_s[0], lc.cap_s), *other.transfer_s[1:])
    other = LayerCost(lc.chunks, other.compute_s, transfer, other.value_s, lc.cap_s)
    stack = [lc if k % 3 else other for k in range(layers)]  # two layer types interleaved
    sol = solve(stack)
    for h in range(layers + 1):
        levels = sol.levels(h)
        assert len(levels) == h and all(len(row) == lc.chunks for row in levels)
        assert simulate(stack[:h], levels) <= lc.cap_s + 1e-9
        # what it reports is what its levels are worth
        got = sum(s.value_s[lv] for s, row in zip(stack, levels) for lv in row)
        assert got == pytest.approx(sol.best_s(h), abs=1e-9)
        assert got >= 0.0  # never worse than recomputing everything


@settings(max_examples=60, deadline=None)
@given(lc=layer_costs(), layers=st.integers(1, 3))
def test_dp_is_near_the_exhaustive_optimum(lc: LayerCost, layers: int) -> None:
    items = lc.chunks * layers
    assume(items <= 6)
    stack = [lc] * layers
    # The DP rounds each transfer up to a backlog quantum (<= cap / 63): compare with the
    # exhaustive optimum under a cap that much tighter per item.
    cap = lc.cap_s * (1 - items / (BUCKETS - 1))
    best = 0.0
    for flat in itertools.product(range(LEVELS), repeat=items):
        rows = [list(flat[k * lc.chunks : (k + 1) * lc.chunks]) for k in range(layers)]
        if simulate(stack, rows) <= cap:
            best = max(best, sum(lc.value_s[lv] for lv in flat))
    # The DP's layer patterns are two-level mixes spread evenly three ways.
    assert solve(stack).best_s(layers) >= 0.85 * best - 1e-9


def test_backward_prefetch_rolls_under_its_cap() -> None:
    """working_set/saved_acts.py BackwardPrefetch keeps up to the cap in flight, topping up before
    each chunk: a layer's sets may total more than the cap and still come in behind its
    backward, while the inbound link keeps up; a set over the cap is copied in when needed."""
    lc = LayerCost(
        4,
        0.007,
        (0.001, 0.006, 0.013, 0.017),
        (0.0, 0.002, 0.003, 0.007),
        0.027,
        back_s=(0.001, 0.004, 0.010, 0.013),
        prefetch_cap_s=0.020,
        inbound_s=0.017,
        busy_s=0.060,
    )
    rec, exposed = lc.row_costs(np.array([[3, 3, 1, 1]]))  # 34 ms back: over the cap
    assert exposed[0] == pytest.approx(max(0.0, 0.017 + 0.034 - 0.060 - rec[0]))
    slow = dataclasses.replace(lc, busy_s=0.030)  # the link cannot keep up: the excess shows
    rec, exposed = slow.row_costs(np.array([[3, 3, 1, 1]]))
    assert exposed[0] == pytest.approx(0.017 + 0.034 - 0.030 - rec[0])
    huge = dataclasses.replace(lc, prefetch_cap_s=0.012)  # level 3's set exceeds the cap
    rec, exposed = huge.row_costs(np.array([[3, 1, 1, 1]]))
    assert exposed[0] == pytest.approx(0.013 + max(0.0, 0.017 + 0.012 - 0.060 - rec[0]))


def test_dp_solves_64_layers_of_32_chunks() -> None:
    """Within a hang guard only: the DP's speed (< 10 ms) is measured in bench/planner.py."""
    lc = LayerCost(
        32,
        0.0078,
        (0.0012, 0.005, 0.006, 0.011),
        tuple(0.0078 * v for v in (0.0, 0.3, 0.7, 0.98)),
        0.02,
    )
    start = time.perf_counter()
    sol = solve([lc] * 64)
    assert time.perf_counter() - start < HANG_S
    assert simulate([lc] * 64, sol.levels(64)) <= 0.02 + 1e-9


# ---------------------------------------------------------------- plan invariants


@st.composite
def models(draw: st.DrawFn) -> ModelDims:
    head_dim = draw(st.sampled_from([32, 64, 128]))
    kv = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv * draw(st.integers(1, 4))
    return ModelDims(
        vocab_size=draw(st.sampled_from([1000, 32000, 128256])),
        hidden_size=heads * head_dim,
        intermediate_size=draw(st.sampled_from([2, 3, 4])) * heads * head_dim,
        num_layers=draw(st.integers(1, 48)),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        max_position_embeddings=65536,
    )


@st.composite
def profiles(draw: st.DrawFn) -> NodeProfile:
    link = draw(st.floats(5e9, 64e9))
    flops = draw(st.floats(1e12, 1e15))
    return NodeProfile(
        "cuda",
        flops,
        draw(st.floats(1e8, 5e9)),
        80 * GIB,
        512 * GIB,
        link,
        link * draw(st.floats(0.8, 1.0)),
        link * draw(st.floats(0.6, 0.95)),
        ((4096, flops * draw(st.floats(0.5, 1.0))), (32768, flops * draw(st.floats(0.5, 1.0)))),
    )


@settings(max_examples=100, deadline=None)
@given(
    dims=models(),
    node=profiles(),
    seq=st.sampled_from([512, 2048, 8192, 32768]),
    batch=st.sampled_from([1, 4, 8, 12, 32]),
    dev=st.floats(0.5, 80),
    host=st.floats(1, 600),
)
def test_working_set_plans_fit_and_more_budget_is_never_slower(
    dims: ModelDims, node: NodeProfile, seq: int, batch: int, dev: float, host: float
) -> None:
    spec = _spec(dims, seq, batch, dev, host)
    start = time.perf_counter()
    try:
        plan = make_ws_plan(spec, dims, node)
    except InfeasibleBudget as exc:
        need = exc.detail["min_budget"]
        assert need["device_gib"] > dev or need["host_gib"] > host
        return
    assert time.perf_counter() - start < HANG_S
    assert plan.predicted.peak_device_bytes <= spec.budget.device_bytes
    assert plan.predicted.peak_host_bytes <= spec.budget.host_bytes
    pred = plan.predicted
    parts = (
        pred.compute_seconds,
        pred.recompute_seconds,
        pred.exposed_transfer_seconds,
        pred.optimizer_seconds,
    )
    assert all(p is not None and p >= 0 for p in parts)
    assert sum(parts) == pytest.approx(pred.step_seconds)  # type: ignore[arg-type]
    assert plan.micro_batch * plan.rounds == batch and plan.working_set is not None
    assert len(plan.working_set.levels) == dims.num_layers
    _, bound = micro_batches(spec, dims, node)
    for more in (1.25, 2.0):
        bigger = make_ws_plan(_spec(dims, seq, batch, dev * more, host), dims, node)
        # within the micro-batch tier more budget only adds candidates; a budget that first
        # admits a micro-batch at AdaWS's bound may be slower than the one below it was, and
        # one that first admits whole sequences below PIECES_FROM_TOKENS (pieces are the
        # fallback tier there, measured slower than the cost model says)
        pieces = (plan.working_set.seq_chunk > 0, bigger.working_set.seq_chunk > 0)  # type: ignore[union-attr]
        same_pieces_tier = seq >= PIECES_FROM_TOKENS or pieces[0] == pieces[1]
        if (bigger.micro_batch >= bound) == (plan.micro_batch >= bound) and same_pieces_tier:
            assert bigger.predicted.step_seconds <= pred.step_seconds * (1 + 1e-9)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_plans_at_every_budget(preset: str) -> None:
    """Each plan within a hang guard only; planning speed is measured in bench/planner.py."""
    dims = PRESETS[preset]
    seq = min(8192, dims.max_position_embeddings)
    for dev in (4, 12, 24, 40, 80):
        spec = _spec(dims, seq, 32, dev, 256)
        start = time.perf_counter()
        with contextlib.suppress(InfeasibleBudget):
            make_plan(spec, dims, H200)
        assert time.perf_counter() - start < HANG_S, (preset, dev)


def test_overrides_win_and_are_validated() -> None:
    dims = PRESETS["llama3-8b-16l"]
    spec = _spec(
        dims,
        8192,
        32,
        24,
        200,
        micro_batch=2,
        window=3,
        r_param=2,
        r_grad=1,
        level=2,
        optimizer="host",
    )
    plan = make_ws_plan(spec, dims, H200)
    ws = plan.working_set
    assert ws is not None and (plan.micro_batch, plan.window) == (2, 3)
    assert (ws.r_param, ws.r_grad, ws.optimizer) == (2, 1, "host")
    assert all(lv == 2 for row in ws.levels for lv in row)
    assert all(
        "(override)" in plan.reasons[k]
        for k in ("micro_batch", "window", "rings", "levels", "optimizer")
    )
    with pytest.raises(InfeasibleBudget):  # a forced window that cannot fit is refused
        make_ws_plan(_spec(dims, 8192, 32, 16, 200, window=16, level=3), dims, H200)


def test_lead_pass_hides_the_host_adamw_and_is_validated() -> None:
    """Llama-3-8B (16 layers) at 12 GiB on the H200 profile with host AdamW: the host updates
    a layer (218M params at 4.1 G/s) slower than one round's forward uses it, so the planner
    takes a lead pass of two rounds, which halves that exposure; it costs the lead pass's
    transition buffers on the device and its extra home sets on the host."""
    dims = PRESETS["llama3-8b-16l"]
    # micro-batch 4 each: 8 sequences a round would hide the update as a lead pass of two
    plans = {
        lead: make_ws_plan(
            _spec(
                dims,
                8192,
                32,
                12,
                100,
                optimizer="host",
                micro_batch=4,
                overlap=False,  # per round (the overlap plans a lead of one: test_overlap.py)
                **({"lead_rounds": lead} if lead else {}),
            ),
            dims,
            H200,
        )
        for lead in (None, 1, 2)
    }
    assert plans[None].working_set.lead_rounds == 2  # type: ignore[union-attr]
    assert "2: the step's first pass" in plans[None].reasons["lead_rounds"]
    one, two = plans[1].predicted, plans[2].predicted
    assert two.optimizer_seconds < 0.6 * one.optimizer_seconds  # type: ignore[operator]
    assert two.peak_host_bytes > one.peak_host_bytes
    assert two.step_seconds < one.step_seconds
    with pytest.raises(InvalidSpec, match="mixture-of-experts"):
        olmoe = PRESETS["olmoe-7b-a1b"]
        make_ws_plan(_spec(olmoe, 4096, 32, 20, 200, lead_rounds=2), olmoe, H200)
    with pytest.raises(InvalidSpec, match="exceeds the step's rounds"):
        make_ws_plan(_spec(dims, 8192, 8, 20, 200, micro_batch=4, lead_rounds=3), dims, H200)


def test_split_adamw_starts_the_host_ahead_and_is_validated() -> None:
    """Llama-3-8B (32 layers) at 24 GiB on the H200 profile, one round a pass: the host
    updates a layer slower than the forward uses it and the device AdamW exposes its
    moments' traffic per layer; the split gives the first layers (and the embedding) to the
    device, so the host thread starts that many layers ahead, and beats both."""
    dims = PRESETS["llama3-8b"]
    plans = {
        opt: make_ws_plan(
            _spec(dims, 8192, 32, 24, 100, lead_rounds=1, **({"optimizer": opt} if opt else {})),
            dims,
            H200,
        )
        for opt in (None, "host", "device", "split")
    }
    auto = plans[None]
    assert auto.working_set is not None and auto.working_set.optimizer == "split"
    k = auto.working_set.device_layers
    assert 0 < k < dims.num_layers
    assert f"layers 0-{k - 1} and the embedding on the device" in auto.reasons["optimizer"]
    for other in ("host", "device"):
        mine, theirs = auto.predicted, plans[other].predicted
        assert mine.step_seconds < theirs.step_seconds
        assert mine.optimizer_seconds < theirs.optimizer_seconds  # type: ignore[operator]
    assert "(override)" in plans["split"].reasons["optimizer"]
    tiny = PRESETS["micro-llama"]
    one_layer = ModelDims(**{**tiny.__dict__, "num_layers": 1})
    with pytest.raises(InvalidSpec, match="at least two layers"):
        make_ws_plan(_spec(one_layer, 64, 4, 1, 8, optimizer="split"), one_layer, H200)
