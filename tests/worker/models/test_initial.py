"""A new model's initial weights: one set for a seed whatever the threads drawing it, N(0,
std) apart from the RMSNorm weights at one, and every block of a tensor its own draw.

    pytest tests/worker/models/test_initial.py
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from wstrain.contracts.model_dims import PRESETS
from wstrain.worker.models import initial
from wstrain.worker.models.dense import LlamaModel
from wstrain.worker.models.initial import BLOCK_NUMEL, init_model, initial_weights


def test_the_values_are_the_seeds_whatever_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(initial, "BLOCK_NUMEL", 1000)  # every large tensor several blocks
    monkeypatch.setattr(initial, "AHEAD_BYTES", 1 << 16)  # and several tensors ahead
    dims = PRESETS["tiny-olmoe"]
    one = dict(initial_weights(dims, 3, threads=1))
    many = dict(initial_weights(dims, 3, threads=4))
    assert list(one) == [n for n, _ in LlamaModel(dims).named_parameters()]
    for name, value in one.items():
        assert torch.equal(many[name], value), name
    other = dict(initial_weights(dims, 4, threads=1))
    assert not torch.equal(other["lm_head.weight"], one["lm_head.weight"])


def test_norms_at_one_the_rest_normal_and_blocks_independent() -> None:
    dims = replace(PRESETS["micro-llama"], vocab_size=8192, hidden_size=1024)
    weights = dict(initial_weights(dims, 0, std=0.02))
    for name, value in weights.items():
        if name.endswith("norm.weight"):
            assert torch.equal(value, torch.ones_like(value)), name
    head = weights["lm_head.weight"].view(-1)  # 8 M values: two blocks
    assert head.numel() == 2 * BLOCK_NUMEL
    assert abs(float(head.std()) - 0.02) < 2e-4 and abs(float(head.mean())) < 1e-4
    first, second = head[:BLOCK_NUMEL], head[BLOCK_NUMEL:]
    assert not torch.equal(first, second)
    corr = torch.corrcoef(torch.stack([first, second]))[0, 1]
    assert abs(float(corr)) < 2e-3  # not one stream repeated or shifted


def test_a_model_takes_the_same_values() -> None:
    dims = PRESETS["micro-llama"]
    model = LlamaModel(dims).to(torch.bfloat16)
    init_model(model, dims, 9)
    for name, value in initial_weights(dims, 9):
        assert torch.equal(dict(model.named_parameters())[name], value.to(torch.bfloat16)), name
