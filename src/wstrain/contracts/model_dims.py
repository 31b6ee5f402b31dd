"""Model dimensions: presets, and resolution of a JobSpec's `model` to one `ModelDims`.

Torch-free, so the API can validate and plan without a GPU stack. The worker builds its
modules from the same `ModelDims` (see worker/models/dense.py), so planner and runtime never
disagree about a model's shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from wstrain.contracts.access import DataAccess
from wstrain.contracts.errors import InvalidSpec
from wstrain.contracts.jobs import PresetInfo
from wstrain.contracts.model_refs import (
    HFConfigModel,
    HFModelConfig,
    ModelRef,
    PathModel,
    PresetModel,
    read_config,
)

# Bytes of training state per parameter: weights + grads + two AdamW moments (+ fp32 master).
STATE_BYTES_PER_PARAM = {"bf16": 2 + 2 + 2 + 2, "mixed": 2 + 4 + 4 + 4 + 4, "fp32": 4 * 4}


@dataclass(frozen=True)
class ModelDims:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    # "llama"; "qwen3" (RMSNorm over each query and key head before RoPE); "olmoe" (RMSNorm
    # over the whole query and key projections, MoE MLP); "qwen3_moe" (Qwen3 attention, MoE);
    # "qwen2_moe" (Llama attention, MoE with a gated shared expert)
    model_type: str = "llama"
    # Llama 3.1 RoPE scaling: (factor, low_freq_factor, high_freq_factor, original context)
    rope_llama3: tuple[float, float, float, int] | None = None
    # Mixture of experts (num_experts > 0): every layer's MLP is a router over num_experts
    # SwiGLU experts of width moe_intermediate_size, experts_per_token of them per token.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the top-k routing weights to sum to one
    router_aux_loss_coef: float = 0.0  # weight of the load-balancing loss (0: none)
    # the embedding row of this token gets no gradient (Hugging Face's padding_idx)
    pad_token_id: int | None = None
    shared_expert_intermediate_size: int = 0  # a SwiGLU every token passes, sigmoid-gated
    qkv_bias: bool = False  # q/k/v projections with bias (Qwen2)

    @property
    def qk_norm(self) -> bool:
        return self.model_type in ("qwen3", "olmoe", "qwen3_moe")

    @property
    def qk_norm_per_head(self) -> bool:
        return self.model_type in ("qwen3", "qwen3_moe")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def ffn_width(self) -> int:
        """Hidden units of the MLP a token passes through (k experts' worth for MoE)."""
        return (
            self.experts_per_token * self.moe_intermediate_size
            + self.shared_expert_intermediate_size
            if self.is_moe
            else self.intermediate_size
        )

    def _layer(self, experts: int) -> int:
        d, h = self.hidden_size, self.head_dim
        q, kv = self.num_heads * h, self.num_kv_heads * h
        attn = 2 * d * q + 2 * d * kv  # q,o + k,v
        if self.is_moe:  # experts, router, and a shared expert with its gate
            mlp = (
                experts * 3 * d * self.moe_intermediate_size
                + self.num_experts * d
                + (
                    3 * d * self.shared_expert_intermediate_size + d
                    if self.shared_expert_intermediate_size
                    else 0
                )
            )
        else:
            mlp = 3 * d * self.intermediate_size
        qk_norms = (2 * h if self.qk_norm_per_head else q + kv) if self.qk_norm else 0
        biases = q + 2 * kv if self.qkv_bias else 0
        return attn + mlp + 2 * d + qk_norms + biases  # + the RMSNorm weights

    @property
    def layer_params(self) -> int:
        """Ψ_total of one decoder layer: what its tiles hold and what crosses PCIe."""
        return self._layer(self.num_experts)

    @property
    def layer_params_active(self) -> int:
        """Ψ_active of one decoder layer: what one token computes with (router included)."""
        return self._layer(self.experts_per_token)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        # embedding + layers + final norm + untied LM head
        return 2 * self.embedding_params + self.num_layers * self.layer_params + self.hidden_size

    @property
    def params_active(self) -> int:
        return (
            2 * self.embedding_params
            + self.num_layers * self.layer_params_active
            + self.hidden_size
        )

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, AdaWS's formula 6·(Ψ_active + S·L·n_Q·h_dim) with
        Ψ_active the active non-embedding parameters (the LM head counts; the embedding
        table is a lookup)."""
        attn = seq_len * self.num_layers * self.num_heads * self.head_dim
        return 6.0 * (self.params_active - self.embedding_params + attn)

    @property
    def architecture(self) -> str:
        return {
            "llama": "LlamaForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
            "olmoe": "OlmoeForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM",
            "qwen2_moe": "Qwen2MoeForCausalLM",
        }[self.model_type]

    def _moe_hf_config(self) -> dict[str, object]:
        if not self.is_moe:
            return {"intermediate_size": self.intermediate_size}
        moe: dict[str, object] = {
            "intermediate_size": self.moe_intermediate_size,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.experts_per_token,
            "norm_topk_prob": self.norm_topk_prob,
            "router_aux_loss_coef": self.router_aux_loss_coef,
            "output_router_logits": self.router_aux_loss_coef > 0,
        }
        if self.model_type in ("qwen3_moe", "qwen2_moe"):
            moe.update(
                moe_intermediate_size=self.moe_intermediate_size,
                decoder_sparse_step=1,
                mlp_only_layers=[],
            )
        if self.model_type == "qwen2_moe":
            moe.update(
                shared_expert_intermediate_size=self.shared_expert_intermediate_size,
                qkv_bias=self.qkv_bias,
                use_sliding_window=False,
            )
        return moe

    def to_hf_config(self) -> dict[str, object]:
        return {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "pad_token_id": self.pad_token_id,
            "hidden_size": self.hidden_size,
            **self._moe_hf_config(),
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            **(
                {
                    "rope_scaling": {
                        "rope_type": "llama3",
                        "factor": self.rope_llama3[0],
                        "low_freq_factor": self.rope_llama3[1],
                        "high_freq_factor": self.rope_llama3[2],
                        "original_max_position_embeddings": self.rope_llama3[3],
                    }
                }
                if self.rope_llama3
                else {}
            ),
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
        }

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _llama(
    vocab: int,
    d: int,
    ffn: int,
    layers: int,
    heads: int,
    kv: int,
    theta: float,
    max_pos: int = 8192,
) -> ModelDims:
    return ModelDims(vocab, d, ffn, layers, heads, kv, d // heads, 1e-5, theta, max_pos)


def _qwen3(
    vocab: int, d: int, ffn: int, layers: int, heads: int, kv: int, max_pos: int = 40960
) -> ModelDims:
    return ModelDims(
        vocab,
        d,
        ffn,
        layers,
        heads,
        kv,
        128 if d >= 1024 else d // heads,
        1e-6,
        1_000_000.0,
        max_pos,
        model_type="qwen3",
    )


def _moe(
    model_type: str,
    vocab: int,
    d: int,
    expert_ffn: int,
    layers: int,
    heads: int,
    kv: int,
    experts: int,
    top_k: int,
    max_pos: int = 4096,
) -> ModelDims:
    """OLMoE (as OLMoE-1B-7B: theta 10000, no top-k renormalisation, aux 0.01) or Qwen3-MoE
    (as Qwen3-30B-A3B: theta 1e6, renormalised top-k, aux 0.001). OLMoE's padding token
    is 1, as in its config."""
    olmoe = model_type == "olmoe"
    return ModelDims(
        vocab,
        d,
        0,
        layers,
        heads,
        kv,
        128 if d >= 1024 else d // heads,
        1e-5 if olmoe else 1e-6,
        10000.0 if olmoe else 1_000_000.0,
        max_pos,
        model_type=model_type,
        num_experts=experts,
        experts_per_token=top_k,
        moe_intermediate_size=expert_ffn,
        norm_topk_prob=not olmoe,
        router_aux_loss_coef=0.01 if olmoe else 0.001,
        pad_token_id=1 if olmoe else None,
    )


PRESETS: dict[str, ModelDims] = {
    # AdaWS Table 1, with exactly the table's dimensions (V, L, d_model, h_dim, n_Q, KV
    # heads, d_expert, routed experts, k); 16 layers is the benchmark configuration of
    # DESIGN.md. Sparse-16Bx3B is the table's own model: Qwen3-MoE layers at its dimensions.
    "llama3-8b": _llama(128256, 4096, 14336, 32, 32, 8, 500000.0),
    "llama3-8b-16l": _llama(128256, 4096, 14336, 16, 32, 8, 500000.0),
    "olmoe-7b-a1b": _moe("olmoe", 50304, 2048, 1024, 16, 16, 16, 64, 8),
    "dense-15b": _llama(128256, 4096, 14336, 64, 32, 8, 500000.0),
    "sparse-16b-a3b": _moe("qwen3_moe", 128256, 3072, 768, 32, 24, 4, 64, 8, 40960),
    "qwen3-32b": _qwen3(152064, 5120, 27648, 64, 40, 8),
    "qwen3-30b-a3b": _moe("qwen3_moe", 151936, 2048, 768, 48, 32, 4, 128, 8, 40960),
    # Small models for tests and demos (byte-level vocab fits the shipped text corpus).
    "tiny-llama": _llama(256, 128, 384, 4, 4, 2, 10000.0, 1024),
    "micro-llama": _llama(256, 32, 64, 2, 4, 2, 10000.0, 512),
    "tiny-qwen3": _qwen3(256, 128, 384, 4, 4, 2, 1024),
    "tiny-olmoe": _moe("olmoe", 256, 128, 64, 4, 4, 4, 8, 2, 1024),
    "tiny-qwen3-moe": _moe("qwen3_moe", 256, 128, 64, 4, 4, 2, 8, 2, 1024),
    # Qwen2-MoE's shape at small size: 8 routed experts, top 2, a shared expert, q/k/v bias
    "tiny-qwen2-moe": replace(
        _moe("qwen3_moe", 256, 128, 64, 4, 4, 2, 8, 2, 1024),
        model_type="qwen2_moe",
        norm_topk_prob=False,
        shared_expert_intermediate_size=256,
        qkv_bias=True,
    ),
}


def preset_list() -> list[PresetInfo]:
    return [
        PresetInfo(
            name=name,
            architecture=d.architecture,
            layers=d.num_layers,
            hidden_size=d.hidden_size,
            intermediate_size=d.intermediate_size,
            heads=d.num_heads,
            kv_heads=d.num_kv_heads,
            head_dim=d.head_dim,
            vocab_size=d.vocab_size,
            max_position_embeddings=d.max_position_embeddings,
            experts=d.num_experts,
            experts_per_token=d.experts_per_token,
            moe_intermediate_size=d.moe_intermediate_size,
            params_total=d.params,
            params_active=d.params_active,
            training_state_bytes={p: d.params * b for p, b in STATE_BYTES_PER_PARAM.items()},
        )
        for name, d in PRESETS.items()
    ]


def dims_from_hf(cfg: HFModelConfig) -> ModelDims:
    heads, rope = cfg.num_attention_heads, cfg.rope
    llama3 = (
        (
            float(rope["factor"]),
            float(rope["low_freq_factor"]),
            float(rope["high_freq_factor"]),
            int(rope["original_max_position_embeddings"]),
        )
        if rope["rope_type"] == "llama3"
        else None
    )
    moe = cfg.num_experts > 0
    return ModelDims(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=0 if moe else cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=cfg.num_key_value_heads or heads,
        head_dim=cfg.head_dim or cfg.hidden_size // heads,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=float(rope["rope_theta"]),
        max_position_embeddings=cfg.max_position_embeddings,
        model_type=cfg.model_type,
        rope_llama3=llama3,
        num_experts=cfg.num_experts,
        experts_per_token=cfg.num_experts_per_tok if moe else 0,
        moe_intermediate_size=(cfg.moe_intermediate_size or cfg.intermediate_size) if moe else 0,
        norm_topk_prob=cfg.norm_topk_prob,
        router_aux_loss_coef=(
            cfg.router_aux_loss_coef if moe and cfg.output_router_logits else 0.0
        ),
        pad_token_id=cfg.pad_token_id,
        shared_expert_intermediate_size=cfg.shared_expert_intermediate_size if moe else 0,
        qkv_bias=cfg.has_qkv_bias,
    )


def resolve_dims(model: ModelRef, access: DataAccess | None = None) -> ModelDims:
    """The dimensions a JobSpec's `model` names; InvalidSpec says what to change. A model
    directory's config.json is read through `access` (by descriptor, under the data roots,
    at most CONFIG_MAX_BYTES; default: any path, still capped), and its errors name fields
    and problems, never the file's values."""
    if isinstance(model, PresetModel):
        if model.preset not in PRESETS:
            raise InvalidSpec(
                f"model.preset={model.preset!r} is unknown; choose one of {sorted(PRESETS)}"
            )
        return PRESETS[model.preset]
    if isinstance(model, HFConfigModel):
        return dims_from_hf(model.hf_config)
    assert isinstance(model, PathModel)
    return dims_from_hf(read_config(str(model.path), access or DataAccess.of(["/"], None)))
