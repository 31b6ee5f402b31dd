"""Hugging Face reference models for a ModelDims (`LlamaForCausalLM`, `Qwen3ForCausalLM`,
`OlmoeForCausalLM`, `Qwen3MoeForCausalLM`, `Qwen2MoeForCausalLM` by dims.model_type), and
their parameters and gradients under the names checkpoints on the Hub use (transformers 5
fuses each MoE layer's experts into `experts.gate_up_proj` (E, 2I, D) and
`experts.down_proj` (E, D, I) in memory, and writes them per expert, as wstrain does)."""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from wstrain.contracts.model_dims import ModelDims

CLASSES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "olmoe": (OlmoeConfig, OlmoeForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM),
}


def hf_causal_lm(dims: ModelDims, attn: str = "eager") -> torch.nn.Module:
    kw = {k: v for k, v in dims.to_hf_config().items() if k not in ("architectures", "model_type")}
    config_cls, model_cls = CLASSES[dims.model_type]
    cfg = config_cls(**kw)
    cfg._attn_implementation = attn
    model = model_cls(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            if dims.is_moe:  # transformers leaves the router at zero (uniform routing)
                layer.mlp.gate.weight.normal_(0.0, 0.5)
            if dims.qkv_bias:  # and biases at zero: make them matter
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0.0, 0.1)
    return model.float()


def hub_tensors(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors by Hub checkpoint name: fused expert stacks split per expert."""
    out = {}
    for name, t in named.items():
        if name.endswith("mlp.experts.gate_up_proj"):  # (E, 2I, D): gate rows, then up rows
            prefix, half = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :half]
                out[f"{prefix}{e}.up_proj.weight"] = t[e, half:]
        elif name.endswith("mlp.experts.down_proj"):  # (E, D, I)
            for e in range(t.shape[0]):
                out[f"{name[: -len('down_proj')]}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def hub_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return hub_tensors(dict(model.state_dict()))


def hub_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return hub_tensors({n: p.grad for n, p in model.named_parameters()})


def perturb_norms(model: torch.nn.Module, seed: int) -> None:
    """RMSNorm weights away from one, so a test sees whether each is applied."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def aux_per_sequence(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """transformers' own load-balancing loss of each sequence of `inputs` (B, S) run on its
    own, a batch of one, summed over the sequences (wstrain's convention: worker/models/moe.py)."""
    return sum(model(input_ids=inputs[b : b + 1]).aux_loss for b in range(inputs.shape[0]))  # type: ignore[return-value]
