"""Hugging Face reference models for a ModelDims: `LlamaForCausalLM`, or `Qwen3ForCausalLM`
when the dims carry Qwen3's q/k RMSNorm."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from scheduler.model_dims import ModelDims


def hf_causal_lm(dims: ModelDims, attn: str = "eager") -> torch.nn.Module:
    kw = {k: v for k, v in dims.to_hf_config().items() if k not in ("architectures",
                                                                    "model_type")}
    cfg = Qwen3Config(**kw) if dims.qk_norm else LlamaConfig(**kw)
    cfg._attn_implementation = attn
    model = Qwen3ForCausalLM(cfg) if dims.qk_norm else LlamaForCausalLM(cfg)
    return model.float()


def perturb_norms(model: torch.nn.Module, seed: int) -> None:
    """RMSNorm weights away from one, so a test sees whether each is applied."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
