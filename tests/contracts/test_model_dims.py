"""Presets carry exactly AdaWS Table 1's dimensions, and their parameter counts equal those of
the Hugging Face model built from the config wstrain writes (on the meta device: no memory)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from wstrain.contracts.model_dims import PRESETS, STATE_BYTES_PER_PARAM, preset_list

# AdaWS Table 1: V, L, d_model, h_dim, n_Q, n_ctx (KV heads), d_expert (the FFN for dense
# models), E_routed, k
TABLE_1 = {
    "llama3-8b": (128256, 32, 4096, 128, 32, 8, 14336, 0, 0),
    "olmoe-7b-a1b": (50304, 16, 2048, 128, 16, 16, 1024, 64, 8),
    "dense-15b": (128256, 64, 4096, 128, 32, 8, 14336, 0, 0),
    "sparse-16b-a3b": (128256, 32, 3072, 128, 24, 4, 768, 64, 8),
    "qwen3-32b": (152064, 64, 5120, 128, 40, 8, 27648, 0, 0),
    "qwen3-30b-a3b": (151936, 48, 2048, 128, 32, 4, 768, 128, 8),
}


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_table_1_dimensions(name: str) -> None:
    d = PRESETS[name]
    got = (
        d.vocab_size,
        d.num_layers,
        d.hidden_size,
        d.head_dim,
        d.num_heads,
        d.num_kv_heads,
        d.moe_intermediate_size if d.is_moe else d.intermediate_size,
        d.num_experts,
        d.experts_per_token,
    )
    assert got == TABLE_1[name]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_parameter_counts_match_transformers(name: str) -> None:
    dims = PRESETS[name]
    cfg = AutoConfig.for_model(**dims.to_hf_config())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert type(model).__name__ == dims.architecture
    assert sum(p.numel() for p in model.parameters()) == dims.params
    if dims.is_moe:  # active: the router and k of E experts per layer
        expert = 3 * dims.hidden_size * dims.moe_intermediate_size
        idle = dims.num_layers * (dims.num_experts - dims.experts_per_token) * expert
        assert dims.params_active == dims.params - idle


def test_preset_list_reports_state_bytes() -> None:
    listed = {p.name: p for p in preset_list()}
    assert set(listed) == set(PRESETS)
    q = listed["qwen3-32b"]
    assert q.architecture == "Qwen3ForCausalLM" and q.params_active == q.params_total
    assert q.training_state_bytes["bf16"] == 8 * q.params_total
    assert all(
        q.training_state_bytes[p] == b * q.params_total for p, b in STATE_BYTES_PER_PARAM.items()
    )
    o = listed["olmoe-7b-a1b"]  # OLMoE-1B-7B: 6.9 B parameters, 1.3 B active
    assert o.architecture == "OlmoeForCausalLM" and (o.experts, o.experts_per_token) == (64, 8)
    assert round(o.params_total / 1e9, 1) == 6.9 and round(o.params_active / 1e9, 1) == 1.3
    assert o.training_state_bytes["bf16"] == 8 * o.params_total  # state covers every expert
