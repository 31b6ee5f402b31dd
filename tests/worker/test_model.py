"""Our decoder against Hugging Face `transformers` (`LlamaForCausalLM`, `Qwen3ForCausalLM`)
on small random configs: same weights, same batch -> same logits, loss and every gradient
(fp32)."""

from __future__ import annotations

import pytest
import torch
from scheduler.model_dims import ModelDims
from tests.worker.hf_models import hf_causal_lm, perturb_norms
from worker.model import LlamaModel, causal_lm_loss

CONFIGS = [
    ModelDims(97, 48, 80, 2, 4, 2, 12, 1e-5, 10000.0, 256),   # GQA 2:1
    ModelDims(64, 32, 96, 3, 4, 4, 8, 1e-6, 500000.0, 256),  # MHA, Llama-3 theta
    ModelDims(50, 64, 64, 1, 8, 1, 16, 1e-5, 10000.0, 256),  # MQA, head_dim*heads != hidden
    ModelDims(97, 48, 80, 2, 4, 2, 16, 1e-6, 1000000.0, 256, qk_norm=True),  # Qwen3 dense
    # Llama 3.1 RoPE scaling, with a short original context so every band is exercised
    ModelDims(97, 48, 80, 2, 4, 2, 12, 1e-5, 500000.0, 256, rope_llama3=(8.0, 1.0, 4.0, 64)),
]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-30))


@pytest.mark.parametrize("dims", CONFIGS, ids=lambda d: f"{d.architecture[:5]}-L{d.num_layers}"
                         f"h{d.num_heads}kv{d.num_kv_heads}")
def test_logits_loss_grads_match_transformers(dims: ModelDims) -> None:
    torch.manual_seed(0)
    ours = LlamaModel(dims)
    ours.init_weights(seed=3)
    perturb_norms(ours, seed=4)
    ref = hf_causal_lm(dims).eval()
    missing = ref.load_state_dict(ours.state_dict(), strict=False)
    # rotary inv_freq is a buffer HF computes itself; every parameter must have loaded
    assert not missing.unexpected_keys
    assert all("rotary" in k for k in missing.missing_keys)
    tokens = torch.randint(0, dims.vocab_size, (3, 17))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    logits = ours(inputs)
    loss = causal_lm_loss(logits, targets)
    loss.backward()
    out = ref(input_ids=tokens, labels=tokens)  # HF shifts labels itself
    out.loss.backward()

    assert rel_err(logits, out.logits[:, :-1]) < 1e-5
    assert abs(loss.item() - out.loss.item()) < 1e-5 * abs(out.loss.item())
    ref_params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert rel_err(p.grad, ref_params[name].grad) < 1e-5, name
