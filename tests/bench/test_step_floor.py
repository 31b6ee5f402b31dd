"""bench/step_floor.py: the FLOPs a long-context step computes (its plan's recomputation
apart, counted by hand here), the in-step rates a profile gives back, and the least step
at them; on the recorded profiles, in-step rates that sit under the rates timed alone."""

from __future__ import annotations

from typing import Any

import pytest

from bench.specs import llama_dims
from bench.step_floor import in_step_rates, least_step, load_row, step_flops

D, H, KV, HD, F = 4096, 32, 8, 128, 14336  # Llama-3-8B
O_PROJ = 2 * D * H * HD  # a token's output projection
QKV = 2 * D * (H + 2 * KV) * HD
GATE_UP = 2 * 2 * D * F


def row(
    layers: int, seq: int, piece: int, levels: list[int], batch: int = 1, **timeline: Any
) -> dict[str, Any]:
    return {
        "name": "long-test",
        "layers": layers,
        "seq_len": seq,
        "global_batch": batch,
        "measured_step_seconds": 10.0,
        "plan": {
            "working_set": {"seq_chunk": piece, "levels": levels},
            "node": {"matmul_flops": 800e12},
            "attention_fwd_bwd_flops": 600e12,
            "kernel_floor_step_seconds": 1.0,
        },
        "timeline": timeline or None,
    }


def test_whole_sequences_at_level_3_recompute_their_output_projections_only() -> None:
    r = row(layers=4, seq=32768, piece=0, levels=[0, 0, 0, 4], batch=2)
    f = step_flops(r, llama_dims(4))
    assert f.recompute_gemm == 2 * 4 * 32768 * O_PROJ
    assert f.recompute_attention == 0
    assert f.attention == 2 * 4 * 3.5 * 2 * 32768**2 * H * HD
    assert f.gemm == 2 * 32768 * llama_dims(4).flops_per_token(0)


def test_units_recomputing_attention_are_each_layers_first_pieces() -> None:
    # 2 layers x 4 pieces of 8K: three units at level 0 (the first piece of both layers and
    # the second of the first), one at level 2, the rest at 1
    c = 8192
    r = row(layers=2, seq=4 * c, piece=c, levels=[3, 4, 1, 0])
    f = step_flops(r, llama_dims(2))
    level = (QKV + O_PROJ + GATE_UP, O_PROJ + GATE_UP, QKV + O_PROJ)
    assert f.recompute_gemm == c * (3 * level[0] + 4 * level[1] + level[2])
    # four units recompute attention: pieces 0, 1 of layer 0 and 0, 1 of layer 1
    assert f.recompute_attention == 2 * (2 * H * HD * (c**2) + 2 * H * HD * ((2 * c) ** 2 - c**2))


def test_levels_must_cover_every_unit() -> None:
    with pytest.raises(AssertionError):
        step_flops(row(layers=2, seq=16384, piece=8192, levels=[0, 3, 0, 0]), llama_dims(2))


def test_a_profile_gives_back_the_rates_it_ran_at_and_its_least_step() -> None:
    base = row(layers=4, seq=65536, piece=8192, levels=[0, 8, 0, 24])
    f = step_flops(base, llama_dims(4))
    gemm_rate, attention_rate = 650e12, 580e12
    gemm_s = (f.gemm + f.recompute_gemm) / gemm_rate
    attention_s = (f.attention + f.recompute_attention) / attention_rate
    kernels = {"_rms_fwd": 0.2, "_add_into": 0.3, "cunn_SoftMaxForward<4, float>": 0.1}
    profiled = row(
        layers=4, seq=65536, piece=8192, levels=[0, 8, 0, 24],
        kernel_s_by_kind={"gemm": gemm_s, "attention": attention_s, "other": 0.6},
        top_kernels_s=kernels, idle_s=0.25, wall_s=gemm_s + attention_s + 0.6 + 0.25,
    )  # fmt: skip
    rates = in_step_rates(profiled)
    assert rates.gemm_flops_per_s == pytest.approx(gemm_rate)
    assert rates.attention_flops_per_s == pytest.approx(attention_rate)
    assert rates.gemm_over_burst == pytest.approx(650 / 800)
    tokens_layers = 65536 * 4
    assert rates.other_s_per_token_layer * tokens_layers == pytest.approx(0.6)
    # the norm and the softmax are the model's; the gradient sums are the runtime's
    assert rates.model_elementwise_s_per_token_layer * tokens_layers == pytest.approx(0.3)
    out = least_step(profiled, rates)
    # the profiled step is the reading, not the warm-up the row timed
    assert out["measured_step_seconds"] == pytest.approx(profiled["timeline"]["wall_s"])
    assert out["least_step_seconds"] == pytest.approx(gemm_s + attention_s + 0.6)
    assert out["recompute_seconds"] == pytest.approx(
        f.recompute_gemm / gemm_rate + f.recompute_attention / attention_rate
    )
    assert out["model_only_tokens_per_s"] == pytest.approx(
        65536 / (f.gemm / gemm_rate + f.attention / attention_rate + 0.3)
    )
    assert "adaws_tokens_per_s" not in out  # 4 layers: AdaWS ran 32


PROFILES = [
    "profile-32k-x8-fa3-h200-2026-11-29.json:long-32768-x8",
    "profile-64k-128k-fa3-host-110gib-h200-2026-11-29.json:long-65536",
    "profile-64k-128k-fa3-host-110gib-h200-2026-11-29.json:long-131072",
    "profile-256k-16-layers-fa3-h200-2026-11-29.json:long-262144",
]


@pytest.mark.parametrize("ref", PROFILES)
def test_recorded_profiles_ran_under_the_rates_timed_alone(ref: str) -> None:
    # a FLOP counted that the step did not compute (or one missed) would put a rate past
    # the kernel's own or far under the power cap's
    rates = in_step_rates(load_row(ref))
    assert 0.80 < rates.gemm_over_burst < 1.0
    assert 0.80 < rates.attention_over_timed <= 1.0
    assert rates.idle_s < 1.0
