"""How a job names its model (contracts/spec.py JobSpec.model): a preset, a Hugging Face
config given inline (HFModelConfig, bounded field by field), or a checkpoint directory;
and the short label listings show for each."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from wstrain.contracts.access import CONFIG_MAX_BYTES, DataAccess, file_problems
from wstrain.contracts.errors import InvalidSpec
from wstrain.contracts.spec_fields import Path_, StrictModel

# ---------------------------------------------------------------- model / data specs

_LLAMA3_ROPE = ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]


class ConfigProblem(ValueError):
    """What is wrong with a config: `str()` shows the fields' values (an inline hf_config's
    are the user's own request), `safe` says the same without them, for a config.json read
    from a file, whose contents never go into an answer (model_dims.resolve_dims)."""

    def __init__(self, problem: str, **values: object) -> None:
        shown = ", ".join(f"{name}={value!r}"[:120] for name, value in values.items())
        super().__init__(f"{problem} (given {shown})" if values else problem)
        self.safe = problem


class HFModelConfig(StrictModel):
    """The subset of a Hugging Face `config.json` wstrain understands: Llama, Qwen3 dense
    (Llama plus an RMSNorm over each query and key head), and the mixture-of-experts OLMoE,
    Qwen3-MoE and Qwen2-MoE (every layer's MLP routed to num_experts_per_tok of num_experts;
    Qwen2-MoE adds a gated shared expert and q/k/v biases)."""

    model_config = ConfigDict(extra="ignore")  # real config.json files carry many extras

    model_type: Literal["llama", "qwen3", "olmoe", "qwen3_moe", "qwen2_moe"] = "llama"

    vocab_size: int = Field(gt=0, le=1 << 22)
    hidden_size: int = Field(gt=0, le=1 << 16)
    intermediate_size: int = Field(gt=0, le=1 << 18)
    num_hidden_layers: int = Field(gt=0, le=1024)
    num_attention_heads: int = Field(gt=0, le=1024)
    num_key_value_heads: int | None = Field(default=None, gt=0, le=1024)
    head_dim: int | None = Field(default=None, gt=0, le=1024)
    rms_norm_eps: float = Field(default=1e-5, gt=0, le=1)
    rope_theta: float = Field(default=10000.0, gt=0, le=1e12)
    # RoPE as transformers >= 5 writes it ({"rope_type", "rope_theta", scaling fields}), or
    # the older `rope_scaling`; types "default" and "llama3" are understood.
    rope_parameters: dict[str, Any] | None = None
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = Field(default=8192, gt=0, le=1 << 24)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    pad_token_id: int | None = Field(default=None, ge=0, le=1 << 22)
    # mixture of experts (olmoe, qwen3_moe)
    num_experts: int = Field(
        default=0, ge=0, le=4096, validation_alias=AliasChoices("num_experts", "num_local_experts")
    )  # transformers 5 writes the latter for qwen3_moe
    num_experts_per_tok: int = Field(default=0, ge=0, le=64)
    moe_intermediate_size: int | None = Field(
        default=None, gt=0, le=1 << 18
    )  # qwen3_moe's expert width
    norm_topk_prob: bool = False
    router_aux_loss_coef: float = Field(default=0.0, ge=0, le=1e3)
    # as in transformers: the load-balancing loss is trained only with output_router_logits
    output_router_logits: bool = False
    decoder_sparse_step: int = Field(default=1, ge=1, le=1024)
    mlp_only_layers: list[int] = Field(default_factory=list, max_length=1024)
    clip_qkv: float | None = None
    shared_expert_intermediate_size: int = Field(default=0, ge=0, le=1 << 18)  # qwen2_moe
    qkv_bias: bool | None = None  # qwen2_moe: q/k/v projections with bias (its default)
    use_sliding_window: bool = False

    @property
    def rope(self) -> dict[str, Any]:
        """The effective RoPE settings: rope_type, rope_theta and any scaling fields."""
        out: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        for extra in (self.rope_scaling, self.rope_parameters):
            if extra:
                out.update(extra)
                out["rope_type"] = extra.get("rope_type", extra.get("type", out["rope_type"]))
        return out

    @model_validator(mode="after")
    def _heads_divide(self) -> HFModelConfig:
        kv = self.num_key_value_heads or self.num_attention_heads
        if self.num_attention_heads % kv:
            raise ConfigProblem(
                "num_attention_heads must be a multiple of num_key_value_heads",
                num_attention_heads=self.num_attention_heads,
                num_key_value_heads=kv,
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ConfigProblem(
                "hidden_size is not divisible by num_attention_heads; set head_dim explicitly",
                hidden_size=self.hidden_size,
                num_attention_heads=self.num_attention_heads,
            )
        if self.tie_word_embeddings:
            raise ConfigProblem(
                "tie_word_embeddings=true is not supported: wstrain trains an untied LM head"
            )
        if self.attention_bias:
            raise ConfigProblem(
                "attention_bias=true is not supported: wstrain's attention has no bias terms"
            )
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            raise ConfigProblem(
                "pad_token_id is outside the vocabulary (at or above vocab_size)",
                pad_token_id=self.pad_token_id,
                vocab_size=self.vocab_size,
            )
        self._check_moe()
        self._check_rope()
        return self

    def _check_rope(self) -> None:
        rope = self.rope
        if rope["rope_type"] not in ("default", "llama3"):
            raise ConfigProblem(
                'rope_type is not supported; wstrain understands "default" and "llama3" RoPE',
                rope_type=rope["rope_type"],
            )
        numbers = ["rope_theta"]
        if rope["rope_type"] == "llama3":
            numbers += _LLAMA3_ROPE
            missing = set(_LLAMA3_ROPE) - set(rope)
            if missing:
                raise ConfigProblem(f"llama3 RoPE scaling lacks {sorted(missing)}")
        for name in numbers:  # dims_from_hf reads them as numbers
            value = rope[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigProblem(f"RoPE's {name} must be a positive number", **{name: value})

    def _check_moe(self) -> None:
        moe_type = self.model_type in ("olmoe", "qwen3_moe", "qwen2_moe")
        if moe_type != (self.num_experts > 0):
            raise ConfigProblem(
                "olmoe, qwen3_moe and qwen2_moe need num_experts > 0, llama and qwen3 have none",
                model_type=self.model_type,
                num_experts=self.num_experts,
            )
        if moe_type and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ConfigProblem(
                "num_experts_per_tok must be between 1 and num_experts",
                num_experts_per_tok=self.num_experts_per_tok,
                num_experts=self.num_experts,
            )
        if self.decoder_sparse_step != 1 or self.mlp_only_layers:
            raise ConfigProblem(
                "dense layers among MoE layers are not supported: use "
                "decoder_sparse_step=1 and mlp_only_layers=[]",
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=self.mlp_only_layers,
            )
        if self.clip_qkv is not None:
            raise ConfigProblem("clip_qkv is not supported: set it to null", clip_qkv=self.clip_qkv)
        if self.use_sliding_window:
            raise ConfigProblem(
                "use_sliding_window=true is not supported: wstrain's attention "
                "is full causal attention"
            )

    @property
    def has_qkv_bias(self) -> bool:
        return self.qkv_bias if self.qkv_bias is not None else self.model_type == "qwen2_moe"


class PresetModel(StrictModel):
    preset: str


class HFConfigModel(StrictModel):
    hf_config: HFModelConfig


class PathModel(StrictModel):
    path: Path_


ModelRef = PresetModel | HFConfigModel | PathModel


def model_label(model: ModelRef) -> str:
    """A short name of the model for labels and listings: the preset, the HF config's
    architecture or the checkpoint directory's name."""
    if isinstance(model, PresetModel):
        return model.preset
    if isinstance(model, PathModel):
        return PurePosixPath(str(model.path)).name
    return model.hf_config.model_type


def read_config(model_dir: str, access: DataAccess) -> HFModelConfig:
    """The config.json of the model directory `model_dir`, opened and checked by `access`;
    InvalidSpec names the field, the problem and the fix, with no content of the file."""
    where = f"model.path={model_dir!r}: its config.json"
    raw = access.read_bytes(
        Path(model_dir) / "config.json",
        "model.path's config.json",
        CONFIG_MAX_BYTES,
        shown=str(Path(model_dir) / "config.json"),
        fix="a Hugging Face config.json is a few KB; point model.path at a model directory",
    )
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:  # its msg is a fixed phrase, with no input in it
        raise InvalidSpec(
            f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
            "save it again with save_pretrained"
        ) from None
    except UnicodeDecodeError as exc:
        raise InvalidSpec(f"{where} is not UTF-8 (at byte {exc.start}); save it as UTF-8") from None
    except (ValueError, RecursionError):  # digits past int's limit; nesting past the stack
        raise InvalidSpec(
            f"{where} is not JSON Python can read (a number of thousands of digits, or "
            "nesting thousands deep); save it again with save_pretrained"
        ) from None
    try:
        return HFModelConfig.model_validate(parsed)
    except ValidationError as exc:
        problems = file_problems(exc)
        raise InvalidSpec(
            f"{where} is not a usable Llama, Qwen3, OLMoE, Qwen3-MoE or Qwen2-MoE config: "
            f"{problems}; fix these fields"
        ) from None
