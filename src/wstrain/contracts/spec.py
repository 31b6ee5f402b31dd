"""What a user submits: JobSpec and its parts (data, evaluation, optimizer, budget, plan
overrides), each field bounded and every bad value a ValidationError naming the field.
Pydantic only; the API validates it, the agent plans it, the worker runs it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from wstrain.contracts.budget import Budget, ChosenBudget
from wstrain.contracts.model_refs import ModelRef
from wstrain.contracts.spec_fields import (
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_NODES,
    MAX_STEPS,
    MAX_TIME_LIMIT_S,
    STORED,
    Path_,
    StrictModel,
    check_text,
)


class SyntheticData(StrictModel):
    kind: Literal["synthetic"]


class TokenData(StrictModel):
    """A token file: one `wstrain prepare` wrote (NAME.bin with its NAME.json header and
    NAME.idx document index), or a bare .bin / .npy of ids."""

    kind: Literal["tokens"]
    path: Path_
    dtype: Literal["uint16", "uint32"] | None = Field(
        default=None,
        description="the ids' width: read from the header beside a prepared file; a bare "
        ".bin without one is uint32 unless this says otherwise",
    )


class TextData(StrictModel):
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


class EvalSpec(StrictModel):
    """A held-out split of the data: its loss is evaluated every `every_steps` steps."""

    heldout_fraction: float = Field(
        default=0.05, gt=0, le=0.5, description="tail of the data kept out of training"
    )
    every_steps: int = Field(default=50, ge=1, le=MAX_STEPS)
    sequences: int = Field(
        default=8, ge=1, le=4096, description="held-out sequences per evaluation"
    )


class OptimizerSpec(StrictModel):
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


Runtime = Literal["resident", "working_set"]


class PlanOverrides(StrictModel):
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
    window_home: bool | None = Field(
        default=None,
        description="working set, long context in pieces: the window of keys and values "
        "with their fp32 gradient sums in host memory, a 64K-key block at a time on the "
        "device (12 GiB less device at 1M tokens); None: the planner weighs it",
    )
    write_buffer_gib: float | None = Field(
        default=None,
        ge=1 / 16,  # the host store's 64 MiB chunk: below it no set could be in flight
        le=64,
        description="working set: saved activations in flight to the host at most, GiB "
        "(device memory); None: the planner's (1 GiB, or 2 or 4 where a whole sequence's saved "
        "set outgrows it and that predicts at least 1% faster)",
    )
    overlap: bool | None = Field(
        default=None,
        description="working set: cross-round overlap, each round's forward beside the "
        "previous round's backward so saved activations travel during backwards too (dense "
        "models, whole sequences); None: the planner weighs it for fp8 saved activations "
        "on one GPU (lossless it measured slower than per round)",
    )


class JobSpec(StrictModel):
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

    # The checks across fields below are field validators reading the fields declared
    # before them (info.data), not model validators: pydantic runs an "after" model
    # validator only once every field passed, so a spec with a bad field and a bad
    # combination would report one, then the other on the next submit.

    @field_validator("overrides")
    @classmethod
    def _data_parallel_updates_on_the_host(
        cls, overrides: PlanOverrides, info: ValidationInfo
    ) -> PlanOverrides:
        # gpus or nodes absent: it failed its own check, reported beside this one
        gpus, nodes = info.data.get("gpus") or 1, info.data.get("nodes") or 1
        opt = overrides.optimizer
        if gpus * nodes > 1 and opt in ("device", "split"):
            of_nodes = f" x nodes={nodes}" if nodes > 1 else ""
            raise ValueError(
                f'gpus={gpus}{of_nodes} with overrides.optimizer="{opt}": a data-parallel '
                "working set updates its one shared host copy on the host (each node's); use "
                'overrides.optimizer "host" (or leave it unset), or one rank (gpus=1, nodes=1)'
            )
        if overrides.window_home and info.data.get("document_mask"):
            raise ValueError(
                "overrides.window_home=true with document_mask: packed documents' pieces "
                "keep their window on the device; drop window_home (or document_mask)"
            )
        return overrides

    @field_validator("activation_precision")
    @classmethod
    def _fp8_needs_16_bits(cls, activation: str, info: ValidationInfo) -> str:
        if activation == "fp8" and info.data.get("precision") == "fp32":
            raise ValueError(
                'activation_precision="fp8" stores 16-bit activations at 8 bits; with '
                'precision="fp32" use activation_precision="bf16" or precision "bf16"/"mixed"'
            )
        return activation

    def at_budget(self, device_gib: float, host_gib: float) -> JobSpec:
        """A copy with fixed budgets at this point of its ranges (what a planner plans);
        ValueError for a point outside them."""
        return self.model_copy(update={"budget": self.budget.at(device_gib, host_gib)})

    def at_chosen(self) -> JobSpec:
        """A copy with fixed budgets at the point it is planned at (itself when fixed)."""
        if not self.budget.ranged:
            return self
        return self.at_budget(self.budget.device_gib, self.budget.host_gib)

    def choosing(self, device_gib: float, host_gib: float) -> JobSpec:
        """A copy that keeps its ranges and runs at this point of them (budget.chosen)."""
        self.budget.at(device_gib, host_gib)  # ValueError outside the ranges
        if not self.budget.ranged:
            return self
        chosen = ChosenBudget(device_gib=device_gib, host_gib=host_gib)
        return self.model_copy(update={"budget": self.budget.model_copy(update={"chosen": chosen})})
