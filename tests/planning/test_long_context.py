"""Planning long sequences (planning/working_set.py with cost_model's pieces):
past whole sequences' reach the planner cuts each sequence into pieces, accounts the
context window in the device budget and every piece's saved set in the host budget, and
records the piece length and the attention kernel; it refuses what no piece length fits
with the smallest budgets that would.

    pytest tests/planning/test_long_context.py
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.helpers.specs import working_set_spec as _spec
from wstrain.contracts.calibration import ATTENTION_BACKWARD_RATIO, ATTENTION_OVERHEAD, GIB
from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.hardware import H100_ADAWS, H200, NodeProfile
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning import cost_model as cm
from wstrain.planning import memory_model as mm
from wstrain.planning.levels import LayerCost, cheapest_drops
from wstrain.planning.resident import make_resident_plan
from wstrain.planning.working_set import make_ws_plan

LLAMA = PRESETS["llama3-8b"]
# the lent H100 as bench.long_context measured it (bench/results/long-context/ and
# bench/results/archive/, H100 rows of 2026-11-26)
H100 = replace(
    H100_ADAWS,
    matmul_flops=761e12,
    host_total_bytes=125 * GIB,
    h2d_bytes_per_s=55e9,
    d2h_bytes_per_s=55e9,
    both_bytes_per_s=50e9,
    attention_points=((4096, 333e12), (8192, 448e12), (16384, 507e12), (32768, 476e12)),
)


@pytest.mark.parametrize("seq", [65536, 131072])
def test_pieces_fit_32_layers_where_whole_sequences_cannot(seq: int) -> None:
    dims = replace(LLAMA, num_layers=32)
    spec = _spec(dims, seq, 1, 24, 110)
    with pytest.raises(InfeasibleBudget):  # whole sequences: activations grow with S
        make_ws_plan(_spec(dims, seq, 1, 24, 110, seq_chunk=0), dims, H100)
    plan = make_ws_plan(spec, dims, H100)
    ws = plan.working_set
    assert ws is not None and 0 < ws.seq_chunk < seq and seq % ws.seq_chunk == 0
    assert ws.attention_kernel == "cudnn-prefix-diagonal"
    pieces = seq // ws.seq_chunk
    assert len(ws.levels) == 32 and all(len(row) == pieces for row in ws.levels)
    assert plan.predicted.peak_device_bytes <= spec.budget.device_bytes
    assert plan.predicted.peak_host_bytes <= spec.budget.host_bytes
    assert f"{pieces} pieces" in plan.reasons["seq_chunk"]


def test_the_window_and_pieces_are_counted() -> None:
    """Device bytes with pieces: the window's K, V, their fp32 sums and one backward key
    block (4 KiB + 8 KiB a token at Llama-3-8B, + the expanded block); the activations of a
    piece, not the sequence."""
    dims, seq = replace(LLAMA, num_layers=16), 262144
    spec = _spec(dims, seq, 1, 24, 110)
    lay = mm.Layout(1, seq_chunk=16384, pieces=16)
    per_token = 8 * 128 * (2 * 2 + 2 * 4)  # K and V bf16, their sums fp32
    block = 65536 * 2 * 2 * (8 * 128 + 32 * 128)
    assert mm.context_window_bytes(dims, spec, lay) == seq * per_token + block
    whole = mm.fixed_device_bytes(dims, spec, mm.Layout(1), 0)
    assert mm.fixed_device_bytes(dims, spec, lay, 0) < whole / 2
    assert mm.saved_bytes(dims, spec, 1, 16384) == 16384 * (4096 * 2 + 4096 * 2 + 4 * 32)
    assert mm.saved_bytes(dims, spec, 0, 16384) * 16 == mm.saved_bytes(dims, spec, 0)


def test_past_the_host_32_layers_refuse_with_the_budget_that_fits_and_16_plan() -> None:
    """At 512K the layer inputs of 32 layers alone are 128 GiB: the host budget binds."""
    spec = _spec(replace(LLAMA, num_layers=32), 524288, 1, 24, 110)
    with pytest.raises(InfeasibleBudget) as e:
        make_ws_plan(spec, replace(LLAMA, num_layers=32), H100)
    need = e.value.min_budget  # type: ignore[attr-defined]
    assert need["host_gib"] > 128 and need["device_gib"] <= 24
    dims = replace(LLAMA, num_layers=16)
    plan = make_ws_plan(_spec(dims, 524288, 1, 24, 110), dims, H100)
    assert plan.working_set is not None and plan.working_set.seq_chunk > 0


def test_shorter_sequences_stay_whole_unless_asked() -> None:
    dims = replace(LLAMA, num_layers=32)
    plan = make_ws_plan(_spec(dims, 32768, 1, 24, 110), dims, H100)
    assert plan.working_set is not None and plan.working_set.seq_chunk == 0
    assert plan.working_set.attention_kernel == "sdpa"
    asked = make_ws_plan(_spec(dims, 32768, 1, 24, 110, seq_chunk=4096), dims, H100)
    assert asked.working_set is not None and asked.working_set.seq_chunk == 4096
    assert "(override)" in asked.reasons["seq_chunk"]


def test_pieces_asked_where_they_cannot_run_are_refused() -> None:
    from wstrain.contracts.errors import InvalidSpec

    dims = replace(LLAMA, num_layers=2)
    moe = PRESETS["tiny-olmoe"]
    with pytest.raises(InvalidSpec, match="seq_chunk"):
        make_ws_plan(_spec(moe, 4096, 1, 24, 110, seq_chunk=1024), moe, H100)
    with pytest.raises(InvalidSpec, match="seq_chunk"):
        make_ws_plan(_spec(dims, 4096, 2, 24, 110, seq_chunk=1024, lead_rounds=2), dims, H100)


@pytest.mark.parametrize("seq", [65536, 131072])
def test_packed_documents_go_in_pieces_where_a_dense_mask_cannot(seq: int) -> None:
    """document_mask at 64K and 128K tokens, 16 layers: a whole sequence's dense mask alone
    is 32 and 128 GiB, past a 24 GiB device; in pieces each document's part runs without
    one, so the job is planned, its per-token RoPE tables counted, and the kernel named."""
    dims = replace(LLAMA, num_layers=16)
    spec = _spec(dims, seq, 1, 24, 110).model_copy(update={"document_mask": True})
    whole = _spec(dims, seq, 1, 24, 110, seq_chunk=0)
    with pytest.raises(InfeasibleBudget):
        make_ws_plan(whole.model_copy(update={"document_mask": True}), dims, H100)
    plan = make_ws_plan(spec, dims, H100)
    ws = plan.working_set
    assert ws is not None and 0 < ws.seq_chunk < seq
    assert ws.attention_kernel == "cudnn-prefix-diagonal-per-document"
    assert plan.predicted.peak_device_bytes <= spec.budget.device_bytes
    lay = mm.Layout(1, seq_chunk=ws.seq_chunk, pieces=seq // ws.seq_chunk)
    tables = 2 * seq * dims.head_dim * 2  # cos and sin per token, bf16, one sequence
    copies = 3 * ws.seq_chunk * dims.num_heads * dims.head_dim * 2
    assert mm.document_bytes(dims, spec, lay) == tables + copies
    plain = spec.model_copy(update={"document_mask": False})
    assert mm.document_bytes(dims, plain, lay) == 0


def test_documents_in_pieces_cost_their_own_attention() -> None:
    """The agent reads the documents' span from the token file (NodeProfile.document_span):
    128K tokens of 8K-token documents in 16K pieces cost a query 8K keys, not the
    sequence's (an H100 measured 17.1 s a step where whole-sequence attention predicted
    48.3 s; bench/RESULTS.md). Unknown (0) or as long as the sequence: the whole-sequence
    cost, the worst case; whole sequences under the dense mask pay it all whatever the span."""
    dims, seq = replace(LLAMA, num_layers=32), 131072
    spec = _spec(dims, seq, 1, 24, 110, seq_chunk=16384).model_copy(update={"document_mask": True})
    step = {
        span: make_ws_plan(spec, dims, H100.with_documents(span)).predicted.step_seconds
        for span in (0, 8192, seq)
    }
    assert step[0] == step[seq]
    # causal attention is 2·S·span·H·hd FLOPs: at 8K a sixteenth of 128K's, the GEMMs alike
    assert 0.2 * step[0] < step[8192] < 0.45 * step[0]
    short = _spec(dims, 8192, 4, 40, 110).model_copy(update={"document_mask": True})
    dense = [
        make_ws_plan(short, dims, H100.with_documents(span)).predicted.step_seconds
        for span in (0, 512)
    ]
    assert dense[0] == dense[1]


def test_documents_in_pieces_are_rated_at_their_calls_length() -> None:
    """A piece of packed documents runs one kernel call per document part, no longer than
    the piece or the document on either side (ops/document_attn.py), so its attention runs
    at the profiled rate that long: 8K documents in 4K pieces at the 4K rate (an H100 ran
    them 14% slower than the 8K rate predicted; bench/RESULTS.md), in 8K pieces at the 8K
    one. A plain piece's prefix call takes the whole prefix and keeps the sequence's rate."""
    dims, seq = replace(LLAMA, num_layers=32), 131072
    node = H100.with_documents(8192)
    assert cm.attention_call(seq, mm.Layout(1, seq_chunk=4096, pieces=32), node) == 4096
    assert cm.attention_call(seq, mm.Layout(1, seq_chunk=16384, pieces=8), node) == 8192
    assert cm.attention_call(seq, mm.Layout(1, seq_chunk=4096, pieces=32), H100) == 0
    assert cm.attention_call(seq, mm.Layout(1), node) == 0  # whole: the dense mask's span
    at = {n: cm.chunk_times(dims, seq, node, 8192, n) for n in (4096, 8192)}
    flops = 2 * seq * 8192 * dims.num_heads * dims.head_dim  # the attention forward's
    slower = flops / node.attention_flops(4096) - flops / node.attention_flops(8192)
    slower *= ATTENTION_OVERHEAD * 3 / (1 + ATTENTION_BACKWARD_RATIO)  # see below
    assert at[4096][0] - at[8192][0] == pytest.approx(slower)
    assert at[4096][1] - at[8192][1] == pytest.approx(ATTENTION_BACKWARD_RATIO * slower)
    step = {}
    for n in (4096, 8192):
        pinned = _spec(dims, seq, 1, 24, 110, seq_chunk=n)
        plan = make_ws_plan(pinned.model_copy(update={"document_mask": True}), dims, node)
        assert plan.working_set is not None and plan.working_set.seq_chunk == n
        step[n] = plan.predicted
    assert step[4096].step_seconds > step[8192].step_seconds  # fewer, larger calls


def test_a_pieces_value_follows_its_prefix_and_averages_out() -> None:
    """Keeping a piece's attention output (levels 1 and 3) saves recomputing its attention
    forward, (s1² - s0²) / S² of the sequence's: the last of 8 pieces 15 times the first.
    Over a sequence the extras sum to 0, so a row at one level costs what it did; whole
    sequences and packed documents have none."""
    dims, seq = replace(LLAMA, num_layers=32), 131072
    lay = mm.Layout(2, seq_chunk=16384, pieces=8)
    extra = cm.piece_values(dims, _spec(dims, seq, 2, 24, 110), lay, H100)
    assert len(extra) == lay.units and extra[:8] == extra[8:]  # per sequence alike
    flops = 2 * seq * seq * dims.num_heads * dims.head_dim  # causal forward, AdaWS's count
    # the profile's rate counts 3 forwards of FLOPs over its timed forward and backward
    core_s = (
        ATTENTION_OVERHEAD * 3 * flops / H100.attention_flops(seq) / (1 + ATTENTION_BACKWARD_RATIO)
    )
    for p, row in enumerate(extra[:8]):
        share = ((p + 1) ** 2 - p**2) / 64
        assert row[1] == row[3] == pytest.approx(core_s * (share - 1 / 8))
        assert row[0] == row[2] == 0.0  # both recompute the attention forward
    assert sum(row[1] for row in extra[:8]) == pytest.approx(0.0, abs=1e-12)
    lc = cm.layer_cost(dims, _spec(dims, seq, 2, 24, 110), lay, H100)
    rec, _ = lc.row_costs(np.array([[1] * 16, [0] * 8 + [1] * 8, [1] * 8 + [0] * 8]))
    assert rec[1] == pytest.approx(rec[2])  # a sequence's place in the round does not count
    first, last = np.array([[0] * 4 + [1] * 4]), np.array([[1] * 4 + [0] * 4])
    lc8 = cm.layer_cost(dims, _spec(dims, seq, 1, 24, 110), replace(lay, micro_batch=1), H100)
    assert lc8.row_costs(first)[0][0] < lc8.row_costs(last)[0][0]
    assert cm.piece_values(dims, _spec(dims, seq, 1, 24, 110), mm.Layout(1), H100) == ()
    docs = H100.with_documents(8192)
    assert (
        cm.piece_values(dims, _spec(dims, seq, 1, 24, 110), replace(lay, micro_batch=1), docs) == ()
    )


def test_over_the_host_budget_the_first_pieces_recompute() -> None:
    """What the host cannot hold is given up where it costs least: the 128K plan at 110 GiB
    keeps every home layer's last pieces' attention output and recomputes its first ones.
    Before, the largest sets went first, which dropped whole layers of pieces, the last
    ones included (bench/RESULTS.md: 5.8 s of recomputation planned, 3.2 s now)."""
    dims, seq = replace(LLAMA, num_layers=32), 131072
    spec = _spec(dims, seq, 1, 24, 110)
    plan = make_ws_plan(spec, dims, H100)
    ws = plan.working_set
    assert ws is not None and ws.seq_chunk < seq
    home = ws.levels[: dims.num_layers - plan.window]
    assert any(0 in row for row in home) and any(1 in row for row in home)  # it had to drop
    for row in ws.levels:  # a sequence's pieces in order: those recomputed come first, in
        assert row == sorted(row), row  # the window as at home
    assert plan.predicted.peak_host_bytes <= spec.budget.host_bytes
    flipped = [row[::-1] for row in home] + ws.levels[len(home) :]
    lay = mm.Layout(1, seq_chunk=ws.seq_chunk, pieces=seq // ws.seq_chunk)
    rec = {
        name: cm.step_time(dims, spec, lay, levels, plan.window, H100, "cuda").recompute_s
        for name, levels in (("planned", ws.levels), ("flipped", flipped))
    }
    assert rec["planned"] < 0.8 * rec["flipped"]


def test_cheapest_drops_free_bytes_where_least_recomputation_is_lost() -> None:
    """Level 3 steps to 1 before 1 steps to 0 where the MLP's set is the cheaper to
    recompute per byte; among alike steps the chunk worth least goes first; each chunk
    steps again from where it stands, and every step frees bytes."""
    lc = LayerCost(
        chunks=3,
        compute_s=1.0,
        transfer_s=(0.1, 0.2, 0.5, 0.6),
        value_s=(0.0, 0.6, 0.3, 0.9),  # level 1 saves 0.6 s for 10 bytes, 3 adds 0.3 for 40
        cap_s=1.0,
        unit_value_s=tuple((0.0, x, 0.0, x) for x in (0.2, 0.0, -0.2)),  # the last worth least
    )
    saved = [10, 20, 50, 60]
    steps = list(cheapest_drops(lc, [[3, 3, 3]], saved))
    assert sorted((c, lv) for _, c, lv, _ in steps[:3]) == [(0, 1), (1, 1), (2, 1)]
    assert [(c, lv) for _, c, lv, _ in steps[3:]] == [(2, 0), (1, 0), (0, 0)]
    assert all(freed > 0 for *_, freed in steps) and sum(s[3] for s in steps) == 3 * 50


def test_a_lead_pass_over_the_host_budget_steps_down_to_fit() -> None:
    """A lead pass sends its extra rounds' sets home too (memory_model.lead_pass_saved), so
    the host fix-up frees bytes until they fit as well: at 80 GiB the pinned lead pass of
    two rounds plans whole sequences with some sets at level 0. Before, it freed only enough
    for one round's sets, the lead check then refused every such candidate, and the
    planner fell through to pieces with one round a pass."""
    dims = replace(LLAMA, num_layers=32)
    spec = _spec(dims, 8192, 8, 80, 80, micro_batch=2, lead_rounds=2, window=2)
    plan = make_ws_plan(spec, dims, H100)
    ws = plan.working_set
    assert ws is not None and ws.lead_rounds == 2 and ws.seq_chunk == 0
    assert any(0 in row for row in ws.levels[: dims.num_layers - plan.window])
    assert plan.predicted.peak_host_bytes <= spec.budget.host_bytes


def test_a_node_with_fa3_plans_pieces_on_it_at_its_measured_rate() -> None:
    """A node whose profile carries FlashAttention-3's rates (attention_flops.fa3.SEQ) plans
    a long sequence's pieces on FA3 and predicts them at FA3's rate: faster than the same
    node without it; whole sequences too (models/dense.py takes FA3 for them), except
    under document masks; a head dim FA3 is not built for keeps the other kernels."""
    dims = replace(LLAMA, num_layers=32)
    spec = _spec(dims, 131072, 1, 24, 110)
    profile = {"matmul_flops": 761e12, "optimizer_params_per_s": 4e9}
    profile |= {f"attention_flops.{s}": f for s, f in H100.attention_points}
    profile |= {f"attention_flops.fa3.{s}": 1.2 * f for s, f in H100.attention_points}
    fa3 = replace(
        H100,
        fa3_attention_points=NodeProfile.from_profile("cuda", profile, 1, 1).fa3_attention_points,
    )
    assert fa3.fa3_attention_points == tuple((s, 1.2 * f) for s, f in H100.attention_points)
    assert NodeProfile.from_profile("cuda", profile, 1, 1).attention_points == H100.attention_points
    with_fa3, without = make_ws_plan(spec, dims, fa3), make_ws_plan(spec, dims, H100)
    assert with_fa3.working_set is not None and without.working_set is not None
    assert with_fa3.working_set.attention_kernel == "fa3-hopper"
    assert without.working_set.attention_kernel == "cudnn-prefix-diagonal"
    assert with_fa3.predicted.compute_seconds < without.predicted.compute_seconds
    docs = make_ws_plan(spec.model_copy(update={"document_mask": True}), dims, fa3)
    assert docs.working_set is not None
    assert docs.working_set.attention_kernel == "fa3-hopper-per-document"
    wide = replace(dims, head_dim=64, num_heads=64)  # FA3 is built for head dim 128 only
    plan = make_ws_plan(_spec(wide, 131072, 1, 24, 110), wide, fa3)
    assert plan.working_set is not None
    assert plan.working_set.attention_kernel == "cudnn-prefix-diagonal"
    whole = _spec(dims, 4096, 8, 24, 110, seq_chunk=0)
    short, short_sdpa = make_ws_plan(whole, dims, fa3), make_ws_plan(whole, dims, H100)
    assert short.working_set is not None and short.working_set.attention_kernel == "fa3-hopper"
    assert short_sdpa.working_set is not None
    assert short_sdpa.working_set.attention_kernel == "sdpa"
    assert short.predicted.compute_seconds < short_sdpa.predicted.compute_seconds
    # under document masks a whole sequence runs SDPA: FA3's points change nothing
    masked = whole.model_copy(update={"document_mask": True})
    on_sdpa = make_ws_plan(masked, dims, fa3)
    assert on_sdpa.working_set is not None and on_sdpa.working_set.attention_kernel == "sdpa"
    assert on_sdpa.predicted == make_ws_plan(masked, dims, H100).predicted
    # the resident planner predicts whole sequences at the same kernel's rate
    two = replace(dims, num_layers=2)  # one that fits an 80 GiB device whole
    resident = _spec(two, 4096, 8, 80, 110, runtime="resident")
    assert (
        make_resident_plan(resident, two, fa3).predicted.step_seconds
        < make_resident_plan(resident, two, H100).predicted.step_seconds
    )


def test_a_host_short_of_the_saved_inputs_is_told_what_would_hold_them() -> None:
    """512K tokens over 8 layers in 24 GiB: each layer's saved input (4 GiB) cannot stay on
    the device, so what the host lacks counts them. Spilling AdamW moments to disk cannot
    make that up (the refusal once asked for a disk as if they stayed on the device), and
    fp8 saved sets can: the host it names for them plans."""
    dims = replace(PRESETS["llama3-8b"], num_layers=8)
    with pytest.raises(InfeasibleBudget) as err:
        make_ws_plan(_spec(dims, 524288, 1, 24, 45), dims, H200)
    message = err.value.message
    assert "the disk tier cannot make up the difference" in message, message
    assert "activation_precision: fp8" in message, message
    host_gib = float(message.rsplit("host_gib=", 1)[1])
    assert host_gib < 45
    fp8 = JobSpec.model_validate(
        {**_spec(dims, 524288, 1, 24, host_gib).model_dump(), "activation_precision": "fp8"}
    )
    plan = make_ws_plan(fp8, dims, H200)
    assert plan.predicted.peak_host_bytes <= host_gib * GIB


def test_attention_costs_what_the_profile_timed_plus_the_runtimes_overhead() -> None:
    """The node profile times causal attention's forward and backward and divides AdaWS's
    FLOPs by it (the backward counted as two forwards: 3 in all); the planner splits a
    layer's attention 1 : 2.5 (flash backward: five matmuls to two). Its forward and
    backward together are the profiled time times ATTENTION_OVERHEAD, not 3.5 / 3 of it
    (1M tokens at 16 layers, H200: 1,449 s predicted where 1,272 ran)."""
    dims, seq, rate = replace(LLAMA, num_layers=1), 65536, 400e12
    node = replace(H200, attention_points=((seq, rate),), matmul_flops=1e30)  # GEMMs: ~0 s
    timed_s = 3 * 2 * seq * seq * dims.num_heads * dims.head_dim / rate
    fwd_s, bwd_s = cm.chunk_times(dims, seq, node)
    assert fwd_s + bwd_s == pytest.approx(ATTENTION_OVERHEAD * timed_s)
    assert bwd_s == pytest.approx(ATTENTION_BACKWARD_RATIO * fwd_s)
