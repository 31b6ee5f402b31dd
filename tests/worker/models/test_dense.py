"""Our decoder against Hugging Face `transformers` (`LlamaForCausalLM`, `Qwen3ForCausalLM`,
`OlmoeForCausalLM`, `Qwen3MoeForCausalLM`, `Qwen2MoeForCausalLM`) on small random configs:
same weights, same batch -> same logits, loss (with the MoE load-balancing loss) and every
gradient (fp32)."""

from __future__ import annotations

import pytest
import torch

from tests.worker.hf_models import (
    aux_per_sequence,
    hf_causal_lm,
    hub_grads,
    hub_state,
    perturb_norms,
)
from tests.worker.models.reference_dims import CONFIGS, MOE
from tests.worker.relative_error import rel_err
from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.dense import LlamaModel, causal_lm_loss
from wstrain.worker.models.moe import RouterTotals


@pytest.mark.parametrize(
    "dims",
    CONFIGS + MOE,
    ids=lambda d: f"{d.architecture[:-11]}-L{d.num_layers}h{d.num_heads}kv{d.num_kv_heads}",
)
def test_logits_loss_grads_match_transformers(dims: ModelDims) -> None:
    torch.manual_seed(0)
    ref = hf_causal_lm(dims).eval()
    perturb_norms(ref, seed=4)
    ours = LlamaModel(dims)
    ours.load_state_dict(hub_state(ref), strict=True)  # every parameter, Hub names
    tokens = torch.randint(0, dims.vocab_size, (3, 17))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    cpu = torch.device("cpu")
    router = RouterTotals(dims.num_experts, cpu, 3, 16) if dims.is_moe else None
    logits = ours(inputs, router)
    loss = causal_lm_loss(logits, targets)
    if router is not None:  # the mean over the sequences of each one's load-balancing loss
        loss = loss + dims.router_aux_loss_coef * router.loss() / 3
    loss.backward()
    out = ref(input_ids=inputs)
    ref_loss = causal_lm_loss(out.logits, targets)
    if dims.is_moe:  # transformers' own aux loss of each sequence alone, weighted as it does
        assert out.aux_loss > 0
        ref_loss = ref_loss + ref.router_aux_loss_coef * aux_per_sequence(ref, inputs) / 3
    ref_loss.backward()

    assert rel_err(logits, out.logits) < 1e-5
    assert abs(loss.item() - ref_loss.item()) < 1e-5 * abs(ref_loss.item())
    ref_grads = hub_grads(ref)
    assert set(ref_grads) == {n for n, _ in ours.named_parameters()}
    for name, p in ours.named_parameters():
        assert rel_err(p.grad, ref_grads[name]) < 1e-5, name
