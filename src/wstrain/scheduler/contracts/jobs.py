"""The contracts every wstrain process shares: JobSpec, JobState, Plan, Job, events, nodes,
Redis key names.

This module imports only pydantic (and the standard library): the API service, the scheduler
agent and the worker all import it, and it must stay importable on a GPU host without
fastapi or redis. Nothing here performs I/O.
"""

from __future__ import annotations

import enum
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from wstrain.scheduler.contracts.calibration import GIB

# Bounds on what a real job can use, so no number a client sends can make planning or
# validation walk for hours: 65,536 sequences a step is 32x the largest published
# pretraining batches at 8K tokens; 10^8 steps outlasts any run; 64 TiB outsizes any node.
MAX_GLOBAL_BATCH = 1 << 16
MAX_STEPS = 100_000_000
MAX_TIME_LIMIT_S = 366 * 86400  # a year: longer is no limit, and floats past it are nonsense
MAX_BUDGET_GIB = 65536.0
MAX_GPUS = 8  # GPUs of one node a data-parallel job takes: the largest common host (8 SXM)
MAX_NODES = 16  # nodes one job spans: every member holds its share until the gang is whole
MAX_PATH_CHARS = 4096  # Linux PATH_MAX
# Strings anywhere in a spec longer than this are refused (a name is 128, a path 4096; a
# free-form string in an hf_config, such as a rope type, is short).
MAX_STRING_CHARS = 4096

# Validation context of a spec read back from the store: it passed every check on submission.
STORED = "stored"

Path_ = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS)]


def check_text(value: object, where: str = "spec") -> None:
    """Refuse a NUL byte or a lone surrogate in any string of a JSON value (keys included):
    neither can be a path, a name or a tokenizer, and a surrogate cannot even be stored as
    UTF-8. Raises ValueError naming the field."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where}: contains a NUL byte; remove it")
        if len(value) > MAX_STRING_CHARS:
            raise ValueError(f"{where}: {len(value)} characters, over {MAX_STRING_CHARS}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where}: contains a lone surrogate, not valid UTF-8") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(k, f"{where} key")
            check_text(v, f"{where}.{str(k)[:64]!s}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_text(v, f"{where}[{i}]")


class JobState(str, enum.Enum):  # noqa: UP042 - StrEnum changes str(); stored as .value
    queued = "queued"
    planning = "planning"
    running = "running"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    timeout = "timeout"  # ran past its time_limit_s: stopped with a checkpoint, resumable


TERMINAL_STATES = frozenset(
    {JobState.succeeded, JobState.failed, JobState.cancelled, JobState.timeout}
)

# Every allowed edge of the job state machine. A terminal state changes only through an
# explicit resume (failed|cancelled -> queued), which starts a new attempt of the same job.
ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.queued: frozenset({JobState.planning, JobState.cancelled}),
    # planning|running -> queued: the agent gave the job back (agent shut down), so another
    # attempt starts from the last checkpoint.
    JobState.planning: frozenset(
        {JobState.running, JobState.failed, JobState.cancelled, JobState.queued}
    ),
    JobState.running: frozenset(
        {
            JobState.succeeded,
            JobState.failed,
            JobState.cancelling,
            JobState.cancelled,
            JobState.queued,
            JobState.timeout,
        }
    ),
    JobState.cancelling: frozenset({JobState.cancelled, JobState.failed, JobState.succeeded}),
    JobState.succeeded: frozenset(),
    JobState.failed: frozenset({JobState.queued}),
    JobState.cancelled: frozenset({JobState.queued}),
    JobState.timeout: frozenset({JobState.queued}),
}


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in ALLOWED_TRANSITIONS[src]


class _Strict(BaseModel):
    """Unknown fields are refused everywhere a user writes JSON."""

    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- model / data specs


class HFModelConfig(_Strict):
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
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={kv}"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; set head_dim explicitly"
            )
        if self.tie_word_embeddings:
            raise ValueError(
                "tie_word_embeddings=true is not supported: wstrain trains an untied LM head"
            )
        if self.attention_bias:
            raise ValueError(
                "attention_bias=true is not supported: wstrain's attention has no bias terms"
            )
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            raise ValueError(
                f"pad_token_id={self.pad_token_id} is outside the vocabulary "
                f"(vocab_size={self.vocab_size})"
            )
        self._check_moe()
        rope = self.rope
        if rope["rope_type"] not in ("default", "llama3"):
            raise ValueError(
                f"rope_type={rope['rope_type']!r} is not supported; wstrain "
                'understands "default" and "llama3" RoPE'
            )
        if rope["rope_type"] == "llama3":
            missing = {
                "factor",
                "low_freq_factor",
                "high_freq_factor",
                "original_max_position_embeddings",
            } - set(rope)
            if missing:
                raise ValueError(f"llama3 RoPE scaling lacks {sorted(missing)}")
        return self

    def _check_moe(self) -> None:
        moe_type = self.model_type in ("olmoe", "qwen3_moe", "qwen2_moe")
        if moe_type != (self.num_experts > 0):
            raise ValueError(
                f"model_type={self.model_type!r} with num_experts="
                f"{self.num_experts}: olmoe, qwen3_moe and qwen2_moe need "
                "num_experts > 0, llama and qwen3 have none"
            )
        if moe_type and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be between 1 "
                f"and num_experts={self.num_experts}"
            )
        if self.decoder_sparse_step != 1 or self.mlp_only_layers:
            raise ValueError(
                "dense layers among MoE layers (decoder_sparse_step="
                f"{self.decoder_sparse_step}, mlp_only_layers="
                f"{self.mlp_only_layers}) are not supported: use "
                "decoder_sparse_step=1 and mlp_only_layers=[]"
            )
        if self.clip_qkv is not None:
            raise ValueError(f"clip_qkv={self.clip_qkv} is not supported: set it to null")
        if self.use_sliding_window:
            raise ValueError(
                "use_sliding_window=true is not supported: wstrain's attention "
                "is full causal attention"
            )

    @property
    def has_qkv_bias(self) -> bool:
        return self.qkv_bias if self.qkv_bias is not None else self.model_type == "qwen2_moe"


class PresetModel(_Strict):
    preset: str


class HFConfigModel(_Strict):
    hf_config: HFModelConfig


class PathModel(_Strict):
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


class SyntheticData(_Strict):
    kind: Literal["synthetic"]


class TokenData(_Strict):
    """A token file: one `wstrain prepare` wrote (NAME.bin with its NAME.json header and
    NAME.idx document index), or a bare .bin / .npy of ids."""

    kind: Literal["tokens"]
    path: Path_
    dtype: Literal["uint16", "uint32"] | None = Field(
        default=None,
        description="the ids' width: read from the header beside a prepared file; a bare "
        ".bin without one is uint32 unless this says otherwise",
    )


class TextData(_Strict):
    """Plain text, or JSON Lines (`.jsonl`: one document per line under `text_field`),
    tokenized and packed: each document ends with the tokenizer's end-of-text token (byte 0
    for the byte tokenizer), so sequences cross document boundaries only at that token."""

    kind: Literal["text"]
    path: Path_
    tokenizer: Path_ = Field(
        default="byte",
        description='"byte" (UTF-8 bytes, vocab 256) or a path to a tokenizers tokenizer.json',
    )
    text_field: str = Field(default="text", min_length=1, max_length=256)


DataRef = Annotated[SyntheticData | TokenData | TextData, Field(discriminator="kind")]


class EvalSpec(_Strict):
    """A held-out split of the data: its loss is evaluated every `every_steps` steps."""

    heldout_fraction: float = Field(
        default=0.05, gt=0, le=0.5, description="tail of the data kept out of training"
    )
    every_steps: int = Field(default=50, ge=1, le=MAX_STEPS)
    sequences: int = Field(
        default=8, ge=1, le=4096, description="held-out sequences per evaluation"
    )


class OptimizerSpec(_Strict):
    lr: float = Field(default=3e-4, gt=0, le=10)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0, le=1)
    weight_decay: float = Field(default=0.0, ge=0, le=10)
    warmup_steps: int = Field(default=0, ge=0, le=MAX_STEPS)
    schedule: Literal["constant", "cosine"] = "cosine"
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    grad_clip: float | None = Field(
        default=1.0, ge=0, le=1e6, description="max global gradient norm; 0 or null: no clipping"
    )

    @field_validator("grad_clip")
    @classmethod
    def _zero_clip_is_off(cls, v: float | None) -> float | None:
        return None if v == 0 else v  # users write 0 for "off", as in transformers

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"betas={list(v)} must each lie in [0, 1)")
        return v


class Budget(_Strict):
    device_gib: float = Field(
        gt=0, le=MAX_BUDGET_GIB, description="hard device-memory budget in GiB"
    )
    host_gib: float = Field(gt=0, le=MAX_BUDGET_GIB, description="hard host-memory budget in GiB")

    @property
    def device_bytes(self) -> int:
        return int(self.device_gib * GIB)

    @property
    def host_bytes(self) -> int:
        return int(self.host_gib * GIB)


Runtime = Literal["resident", "working_set"]


class PlanOverrides(_Strict):
    """Manual plan choices; each one wins over the planner's and is validated."""

    runtime: Runtime | None = None
    micro_batch: int | None = Field(default=None, gt=0, le=MAX_GLOBAL_BATCH)
    device: Literal["cpu", "cuda"] | None = None
    window: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="working set: layers whose saved activations stay on the device",
    )
    r_param: int | None = Field(default=None, ge=2, le=64, description="working set: weight slots")
    r_grad: int | None = Field(default=None, ge=1, le=64, description="working set: gradient slots")
    level: int | None = Field(
        default=None,
        ge=0,
        le=3,
        description="working set: saved-activation level of every (layer, chunk)",
    )
    optimizer: Literal["host", "device", "split"] | None = Field(
        default=None,
        description="working set: AdamW on the host CPU, on the device, or "
        "split (the first layers on the device, the rest on the host; the planner picks how "
        "many)",
    )
    lead_rounds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GLOBAL_BATCH,
        description="working set: rounds whose sequences the step's "
        "first pass carries (more compute per weight load while last step's update lands)",
    )
    seq_chunk: int | None = Field(
        default=None,
        ge=0,
        le=1 << 20,
        description="working set: tokens per piece of a sequence for long context (each "
        "layer runs a sequence a piece at a time against a window of its keys and values); "
        "0 = whole sequences",
    )


class JobSpec(_Strict):
    @model_validator(mode="before")
    @classmethod
    def _plain_text(cls, data: Any, info: ValidationInfo) -> Any:
        if not (info.context and info.context.get(STORED)):  # checked when it was submitted
            check_text(data)
        return data

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    model: ModelRef
    data: DataRef
    seq_len: int = Field(gt=0, le=1 << 20)
    global_batch: int = Field(gt=0, le=MAX_GLOBAL_BATCH, description="sequences per optimizer step")
    gpus: int = Field(
        default=1,
        ge=1,
        le=MAX_GPUS,
        description="GPUs of one node the job trains on, data parallel: each GPU trains "
        "global_batch/gpus sequences a step; budget.device_gib is per GPU, budget.host_gib is "
        "the job's (one shared host copy of the training state)",
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=MAX_NODES,
        description="nodes the job spans; gpus is per node; the state dir must be on a "
        "filesystem every node shares (checkpoints are written by global rank 0)",
    )
    steps: int = Field(gt=0, le=MAX_STEPS)
    optimizer: OptimizerSpec = OptimizerSpec()
    precision: Literal["bf16", "mixed", "fp32"] = "bf16"
    activation_precision: Literal["bf16", "fp8"] = Field(
        default="bf16",
        description="working set: the saved activations sent to host memory as they are, or "
        "(opt-in, lossy) as float8 e4m3 with a scale per 128 elements: half the host bytes "
        "and link traffic; needs a 16-bit precision",
    )
    budget: Budget
    checkpoint_every: int = Field(
        default=0, ge=0, le=MAX_STEPS, description="0: only at the end and at cancel"
    )
    keep_checkpoints: int = Field(
        default=2, ge=1, le=1000, description="newest checkpoints kept; older ones are deleted"
    )
    eval: EvalSpec | None = None
    seed: int = Field(default=0, ge=0, le=(1 << 63) - 1)
    shuffle: bool = Field(
        default=True,
        description="each epoch visits the data's sequences in an order drawn from (seed, "
        "epoch); false: in file order",
    )
    document_mask: bool = Field(
        default=False,
        description="packed documents kept apart: attention never crosses a document "
        "boundary and positions restart at each document (needs a prepared token file or "
        "text data, which know their boundaries)",
    )
    priority: int = Field(
        default=0,
        ge=-100,
        le=100,
        description="the job's priority class: a higher class runs first and may preempt "
        "lower ones (they checkpoint and requeue); within a class, fair share orders",
    )
    exclusive: bool = Field(
        default=False, description="a whole GPU for this job: no other job is packed beside it"
    )
    time_limit_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TIME_LIMIT_S,
        description="wall time of one run; past it the job checkpoints and ends `timeout` "
        "(resumable), with a warning event WSTRAIN_TIME_LIMIT_GRACE_S before",
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="a worker that dies (killed, OOM, a CUDA error, a lost node) is requeued "
        "from its last checkpoint this many times, with back-off, before the job fails",
    )
    after: list[Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]] = Field(
        default=[],
        max_length=64,
        description="ids of jobs that must succeed before this one starts",
    )
    group: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="a sweep's shared id (`wstrain submit --sweep` sets it)",
    )
    overrides: PlanOverrides = PlanOverrides()

    @field_validator("gpus")
    @classmethod
    def _gpus_divide_the_batch(cls, gpus: int, info: ValidationInfo) -> int:
        batch = info.data.get("global_batch")  # absent when it failed its own check
        if batch is not None and batch % gpus:
            raise ValueError(
                f"gpus={gpus} must divide global_batch={batch}: each GPU trains "
                f"global_batch/gpus sequences a step; use a global_batch that is a multiple "
                f"of {gpus}, or gpus among the divisors of {batch}"
            )
        return gpus

    @field_validator("nodes")
    @classmethod
    def _nodes_divide_the_batch(cls, nodes: int, info: ValidationInfo) -> int:
        batch, gpus = info.data.get("global_batch"), info.data.get("gpus")
        if batch is not None and gpus is not None and batch % (gpus * nodes):
            raise ValueError(
                f"nodes={nodes} x gpus={gpus} must divide global_batch={batch}: each of the "
                f"{gpus * nodes} ranks trains global_batch/(gpus x nodes) sequences a step; "
                f"use a global_batch that is a multiple of {gpus * nodes}, or fewer nodes"
            )
        return nodes

    @model_validator(mode="after")
    def _data_parallel_updates_on_the_host(self) -> JobSpec:
        opt = self.overrides.optimizer
        if self.gpus * self.nodes > 1 and opt in ("device", "split"):
            of_nodes = f" x nodes={self.nodes}" if self.nodes > 1 else ""
            raise ValueError(
                f'gpus={self.gpus}{of_nodes} with overrides.optimizer="{opt}": a data-parallel '
                "working set updates its one shared host copy on the host (each node's); use "
                'overrides.optimizer "host" (or leave it unset), or one rank (gpus=1, nodes=1)'
            )
        return self

    @model_validator(mode="after")
    def _fp8_needs_16_bits(self) -> JobSpec:
        if self.activation_precision == "fp8" and self.precision == "fp32":
            raise ValueError(
                'activation_precision="fp8" stores 16-bit activations at 8 bits; with '
                'precision="fp32" use activation_precision="bf16" or precision "bf16"/"mixed"'
            )
        return self


# ---------------------------------------------------------------- plan


class Predicted(BaseModel):
    step_seconds: float
    peak_device_bytes: int
    peak_host_bytes: int
    # The step's breakdown (they sum to step_seconds): compute at the node's profiled rates,
    # recomputation in backward, transfers not hidden behind compute, exposed optimizer,
    # and with several ranks the gradients' all-reduce.
    compute_seconds: float | None = None
    recompute_seconds: float | None = None
    exposed_transfer_seconds: float | None = None
    optimizer_seconds: float | None = None
    # data parallel (Plan.ranks > 1): the gradients' all-reduce after each rank's step
    allreduce_seconds: float | None = None


class WorkingSetPlan(BaseModel):
    """What the working-set runtime needs beyond micro_batch/rounds/window."""

    chunk: int = Field(description="sequences per chunk")
    r_param: int
    r_grad: int
    levels: list[list[int]] = Field(
        description="saved-activation level per [layer][unit] (a unit: a sequence, or a piece "
        "of one with seq_chunk)"
    )
    loss_tokens: int
    optimizer: Literal["host", "device", "split"] = Field(
        default="host",
        description="deferred into the next step's first forward; host: CPU "
        "AdamW in a thread; device: AdamW on the device over streamed moments; split: the "
        "first device_layers layers and the embedding on the device, the others and the "
        "head on the host, both at once",
    )
    device_layers: int = Field(
        default=0, ge=0, description="split: the leading layers whose update runs on the device"
    )
    lead_rounds: int = Field(
        default=1,
        ge=1,
        description="the step's first pass carries the sequences of this "
        "many rounds: each layer's weights then serve more compute while the deferred "
        "optimizer update of the last step arrives layer by layer",
    )
    seq_chunk: int = Field(
        default=0,
        ge=0,
        description="tokens per piece of a sequence (long context: a layer runs "
        "each sequence a piece at a time against a window of its keys and values, and levels "
        "are per [layer][sequence x piece]); 0 = whole sequences",
    )
    attention_kernel: str = Field(
        default="", description="with seq_chunk: the kernel a piece's attention runs"
    )


class Plan(BaseModel):
    runtime: Runtime = "resident"
    device: Literal["cpu", "cuda"]
    micro_batch: int
    rounds: int
    ranks: int = Field(
        default=1,
        ge=1,
        description="processes a node, one per GPU; rounds and micro_batch are per rank",
    )
    nodes: int = Field(default=1, ge=1, description="nodes, each running `ranks` ranks")
    window: int = Field(description="layers resident on the device at once")
    layers: int
    params: int
    predicted: Predicted
    reasons: dict[str, str]
    working_set: WorkingSetPlan | None = None


class MinBudget(BaseModel):
    device_gib: float
    host_gib: float


# ---------------------------------------------------------------- jobs, events, nodes


class Job(BaseModel):
    id: str
    name: str
    owner: str
    state: JobState
    attempt: int
    rev: int = Field(default=0, description="bumped by every change to the job")
    step: int
    steps: int
    epoch: float | None = Field(default=None, description="epochs of the training data done")
    tokens_seen: int | None = Field(default=None, description="input tokens trained on")
    data_position: int | None = Field(
        default=None,
        description="sequences of the data order consumed (step x global_batch): the next "
        "step starts at this position of the order, epoch after epoch",
    )
    loss: float | None = None
    eval_loss: float | None = Field(default=None, description="held-out loss, last evaluation")
    tokens_per_s: float | None = None
    mfu: float | None = None
    step_seconds: float | None = None
    eta_s: float | None = None
    error: str | None = None
    state_reason: str | None = Field(
        default=None,
        description="why a queued job waits (quota, resources, dependency, back-off, "
        "priority), or why it was requeued",
    )
    retries: int = Field(default=0, description="automatic retries after a worker died")
    node: str | None = None
    gpu: str | None = Field(
        default=None,
        description="the GPU index on its node, once running; a job on several GPUs lists "
        'them all, comma-separated ("0,1")',
    )
    worker_pid: int | None = None
    last_checkpoint: str | None = None
    created_at: float
    updated_at: float
    plan: Plan | None = None
    spec: JobSpec
    telemetry: dict[str, float] = Field(
        default={},
        description="the worker's latest runtime telemetry: stall seconds by "
        "dependency, transfer bytes and bandwidth, host RSS/arena/pinned, device peaks",
    )


def gpu_text(indices: tuple[int, ...]) -> str:
    """Job.gpu as stored and shown: the GPU indices comma-separated ("0,1"; "" for none)."""
    return ",".join(str(i) for i in indices)


def gpu_indices(text: str | None) -> tuple[int, ...]:
    """The GPU indices of a Job.gpu string ("0,1" -> (0, 1); "" or None -> ())."""
    return tuple(int(part) for part in (text or "").split(",") if part.strip())


class JobList(BaseModel):
    jobs: list[Job] = Field(description="newest first; each without its plan (GET .../plan)")
    total: int
    offset: int
    limit: int


class Event(BaseModel):
    id: str
    ts: float
    kind: str
    message: str
    data: dict[str, Any] = {}


class GPUInfo(BaseModel):
    index: int
    name: str
    total_bytes: int
    free_bytes: int


class Node(BaseModel):
    name: str
    device: Literal["cpu", "cuda"]
    gpus: list[GPUInfo]
    host_total_bytes: int
    host_free_bytes: int
    slots: int
    running: list[str]
    profile: dict[str, float]
    heartbeat_at: float
    # the agent process that holds this node name: a second agent with the same name is
    # refused while this one heartbeats
    agent_id: str = ""
    agent_pid: int | None = None
    # where that agent runs, and its start time (clock ticks since boot): an agent started
    # on the same host can tell that its predecessor under this name is dead, not just quiet
    host: str = ""
    agent_start: int | None = None


class PresetInfo(BaseModel):
    """One model preset, as `GET /v1/presets` lists it."""

    name: str
    architecture: str
    layers: int
    hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    experts: int = Field(description="routed experts per layer (0: dense)")
    experts_per_token: int
    moe_intermediate_size: int
    params_total: int
    params_active: int = Field(
        description="parameters a token passes through (= total for dense models)"
    )
    training_state_bytes: dict[str, int] = Field(
        description="weights + gradients + AdamW moments (+ fp32 master in mixed), by precision"
    )


class PresetList(BaseModel):
    presets: list[PresetInfo]


class WorkerMessage(BaseModel):
    """One JSON line a worker writes on stdout for its agent."""

    kind: Literal["started", "step", "eval", "checkpoint", "log", "error"]
    step: int | None = None
    epoch: float | None = None  # epochs of the training data done
    tokens_seen: int | None = None
    data_position: int | None = None  # sequences of the data order consumed
    loss: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    step_seconds: float | None = None
    path: str | None = None
    message: str | None = None
    metrics: dict[str, float] = {}
    # on `started`: what the MFU is measured against (None on CPU unless the agent is given a
    # peak) and the model FLOPs per trained token (README's formula)
    flops_per_token: float | None = None
    peak_flops: float | None = None  # FLOP/s, dense, for `precision`
    peak_source: str | None = None  # a chip-table row, "measured" or "configured"
    precision: str | None = None  # the compute precision: bf16, fp32, tf32


class WorkerExit(int, enum.Enum):
    succeeded = 0
    failed = 1
    cancelled = 3


# ---------------------------------------------------------------- redis keys


class Keys:
    """Every Redis key wstrain uses, under one prefix so a shared Redis stays tidy."""

    def __init__(self, prefix: str = "wstrain") -> None:
        self.prefix = prefix

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def events(self, job_id: str) -> str:
        return f"{self.prefix}:events:{job_id}"

    @property
    def jobs(self) -> str:  # sorted set: id by created_at
        return f"{self.prefix}:jobs"

    @property
    def queue(self) -> str:  # sorted set: id by (-priority, created_at)
        return f"{self.prefix}:queue"

    def by_state(self, state: str) -> str:  # sorted set: ids in that state by created_at
        return f"{self.prefix}:by-state:{state}"

    def by_owner(self, owner: str) -> str:  # sorted set: the owner's ids by created_at
        return f"{self.prefix}:by-owner:{owner}"

    @property
    def nodes(self) -> str:  # set of node names
        return f"{self.prefix}:nodes"

    def node(self, name: str) -> str:  # string (Node JSON) with a TTL = heartbeat
        return f"{self.prefix}:node:{name}"

    @property
    def queue_wait(self) -> str:  # hash: the queue-wait histogram's buckets, count and sum
        return f"{self.prefix}:metrics:queue-wait"

    @property
    def exporter_lease(self) -> str:  # string: the API replica exporting store-wide series
        return f"{self.prefix}:metrics:exporter"


def job_dir(state_dir: str | Path, job_id: str) -> Path:
    return Path(state_dir) / "jobs" / job_id
