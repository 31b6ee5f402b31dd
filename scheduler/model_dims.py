"""Model dimensions: presets, and resolution of a JobSpec's `model` to one `ModelDims`.

Torch-free, so the API can validate and plan without a GPU stack. The worker builds its
modules from the same `ModelDims` (see worker/model.py), so planner and runtime never
disagree about a model's shape.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from scheduler.contracts import (HFConfigModel, HFModelConfig, ModelRef, PathModel, PresetInfo,
                                 PresetModel)
from scheduler.errors import InvalidSpec


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
    qk_norm: bool = False  # Qwen3: RMSNorm over each query and key head before RoPE
    # Llama 3.1 RoPE scaling: (factor, low_freq_factor, high_freq_factor, original context)
    rope_llama3: tuple[float, float, float, int] | None = None

    @property
    def layer_params(self) -> int:
        d, h = self.hidden_size, self.head_dim
        attn = d * self.num_heads * h * 2 + d * self.num_kv_heads * h * 2  # q,o + k,v
        mlp = 3 * d * self.intermediate_size
        qk_norms = 2 * h if self.qk_norm else 0
        return attn + mlp + 2 * d + qk_norms  # + the RMSNorm weights

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        # embedding + layers + final norm + untied LM head
        return 2 * self.embedding_params + self.num_layers * self.layer_params + self.hidden_size

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, AdaWS's formula 6·(Ψ + S·L·n_Q·h_dim)."""
        attn = seq_len * self.num_layers * self.num_heads * self.head_dim
        return 6.0 * (self.params + attn)

    @property
    def architecture(self) -> str:
        return "Qwen3ForCausalLM" if self.qk_norm else "LlamaForCausalLM"

    def to_hf_config(self) -> dict[str, object]:
        return {
            "architectures": [self.architecture],
            "model_type": "qwen3" if self.qk_norm else "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            **({"rope_scaling": {"rope_type": "llama3", "factor": self.rope_llama3[0],
                                 "low_freq_factor": self.rope_llama3[1],
                                 "high_freq_factor": self.rope_llama3[2],
                                 "original_max_position_embeddings": self.rope_llama3[3]}}
               if self.rope_llama3 else {}),
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
        }

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _llama(vocab: int, d: int, ffn: int, layers: int, heads: int, kv: int, theta: float,
           max_pos: int = 8192) -> ModelDims:
    return ModelDims(vocab, d, ffn, layers, heads, kv, d // heads, 1e-5, theta, max_pos)


def _qwen3(vocab: int, d: int, ffn: int, layers: int, heads: int, kv: int,
           max_pos: int = 40960) -> ModelDims:
    return ModelDims(vocab, d, ffn, layers, heads, kv, 128 if d >= 1024 else d // heads, 1e-6,
                     1_000_000.0, max_pos, qk_norm=True)


PRESETS: dict[str, ModelDims] = {
    # AdaWS Table 1, dense models, with exactly the table's dimensions (its MoE models wait
    # for MoE layers); 16 layers is the benchmark configuration of DESIGN.md.
    "llama3-8b": _llama(128256, 4096, 14336, 32, 32, 8, 500000.0),
    "llama3-8b-16l": _llama(128256, 4096, 14336, 16, 32, 8, 500000.0),
    "dense-15b": _llama(128256, 4096, 14336, 64, 32, 8, 500000.0),
    "qwen3-32b": _qwen3(152064, 5120, 27648, 64, 40, 8),
    # Small models for tests and demos (byte-level vocab fits the shipped text corpus).
    "tiny-llama": _llama(256, 128, 384, 4, 4, 2, 10000.0, 1024),
    "micro-llama": _llama(256, 32, 64, 2, 4, 2, 10000.0, 512),
    "tiny-qwen3": _qwen3(256, 128, 384, 4, 4, 2, 1024),
}


def preset_list() -> list[PresetInfo]:
    return [PresetInfo(
        name=name, architecture=d.architecture, layers=d.num_layers, hidden_size=d.hidden_size,
        intermediate_size=d.intermediate_size, heads=d.num_heads, kv_heads=d.num_kv_heads,
        head_dim=d.head_dim, vocab_size=d.vocab_size,
        max_position_embeddings=d.max_position_embeddings, params_total=d.params,
        params_active=d.params,
        training_state_bytes={p: d.params * b for p, b in STATE_BYTES_PER_PARAM.items()})
        for name, d in PRESETS.items()]


def dims_from_hf(cfg: HFModelConfig) -> ModelDims:
    heads, rope = cfg.num_attention_heads, cfg.rope
    llama3 = (float(rope["factor"]), float(rope["low_freq_factor"]),
              float(rope["high_freq_factor"]), int(rope["original_max_position_embeddings"])
              ) if rope["rope_type"] == "llama3" else None
    return ModelDims(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=cfg.num_key_value_heads or heads,
        head_dim=cfg.head_dim or cfg.hidden_size // heads,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=float(rope["rope_theta"]),
        max_position_embeddings=cfg.max_position_embeddings,
        qk_norm=cfg.model_type == "qwen3",
        rope_llama3=llama3,
    )


def resolve_dims(model: ModelRef) -> ModelDims:
    """The dimensions a JobSpec's `model` names; InvalidSpec says what to change."""
    if isinstance(model, PresetModel):
        if model.preset not in PRESETS:
            raise InvalidSpec(
                f"model.preset={model.preset!r} is unknown; choose one of {sorted(PRESETS)}"
            )
        return PRESETS[model.preset]
    if isinstance(model, HFConfigModel):
        return dims_from_hf(model.hf_config)
    assert isinstance(model, PathModel)
    cfg_path = Path(model.path) / "config.json"
    if not cfg_path.is_file():
        raise InvalidSpec(f"model.path={model.path!r} has no config.json; point it at a "
                          "Hugging Face model directory")
    try:
        cfg = HFModelConfig.model_validate(json.loads(cfg_path.read_text()))
    except ValueError as exc:
        raise InvalidSpec(f"{cfg_path} is not a usable Llama or Qwen3 config: {exc}") from exc
    return dims_from_hf(cfg)
