"""The resident runtime: the whole model, its optimizer state and its activations live on
the device. It is the baseline the working-set runtime is measured against
(`runtime: resident` in a Plan). It never touches Redis: it takes dims, a plan-derived
config and data, and returns per-step results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import OptimizerSpec
from wstrain.contracts.step_shape import step_tokens
from wstrain.worker.io.hf_load import stream_into
from wstrain.worker.models.dense import LlamaModel, causal_lm_loss
from wstrain.worker.models.initial import init_model
from wstrain.worker.models.moe import RouterTotals
from wstrain.worker.runtime.base import Batches, HostMemory
from wstrain.worker.runtime.distributed import ProcessGroup, RankSlice
from wstrain.worker.runtime.optim import make_adamw
from wstrain.worker.runtime.stats import StepStats

PARAM_DTYPE = {"bf16": torch.bfloat16, "mixed": torch.float32, "fp32": torch.float32}


@dataclass(frozen=True)
class RuntimeConfig:
    precision: str  # "bf16" | "mixed" | "fp32"
    device: str  # "cpu" | "cuda"
    micro_batch: int
    rounds: int
    steps: int
    seed: int
    # tokens a sequence: the spec's seq_len, as the working set's config reads it; the data
    # handed to train_step holds sequences of this length
    seq_len: int
    document_mask: bool = False  # attention within packed documents, positions per document


class ResidentRuntime:
    def __init__(
        self,
        dims: ModelDims,
        cfg: RuntimeConfig,
        opt: OptimizerSpec,
        group: ProcessGroup | None = None,
    ) -> None:
        """`group`: data parallel over its ranks (runtime/distributed.py); cfg.rounds and
        cfg.micro_batch are then this rank's share of the global batch."""
        self.dims, self.cfg, self.opt_spec, self.group = dims, cfg, opt, group
        self.device = torch.device(cfg.device)
        model = LlamaModel(dims)
        init_model(model, dims, cfg.seed)
        self.model = model.to(device=self.device, dtype=PARAM_DTYPE[cfg.precision])
        self.optimizer, self.schedule = make_adamw(self.model.parameters(), opt, cfg.steps)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def optimizer_state(self) -> dict[str, object]:
        return {"optimizer": self.optimizer.state_dict(), "schedule": self.schedule.state_dict()}

    def load_state(self, weights: dict[str, torch.Tensor] | Path, extra: dict[str, object]) -> None:
        """Weights by name, or a checkpoint directory to stream them from."""
        if isinstance(weights, Path):
            stream_into(dict(self.model.named_parameters()), weights)
        else:
            self.model.load_state_dict(weights, strict=True)
        self.optimizer.load_state_dict(extra["optimizer"])  # type: ignore[arg-type]
        self.schedule.load_state_dict(extra["schedule"])  # type: ignore[arg-type]

    def host_memory(self) -> HostMemory:
        return HostMemory()  # the training state lives on the device

    def finish(self) -> None:
        """Nothing is deferred: each step's update is applied within the step."""

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def eval_loss(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        documents: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> float:
        """Mean next-token loss of (B, S) inputs, micro_batch sequences at a time."""
        total, n, mb = 0.0, 0, self.cfg.micro_batch
        for i, (x, y) in enumerate(zip(inputs.split(mb), targets.split(mb))):
            docs = None
            if documents is not None:
                docs = tuple(d[i * mb : (i + 1) * mb].to(self.device) for d in documents)
            with torch.autocast(
                self.device.type, torch.bfloat16, enabled=self.cfg.precision == "mixed"
            ):
                logits = self.model(x.to(self.device), None, docs)  # (b, S, V)
            total += float(causal_lm_loss(logits, y.to(self.device))) * y.numel()
            n += y.numel()
        return total / n

    def train_step(self, data: Batches, step: int) -> StepStats:
        """One optimizer step (0-based `step`) over cfg.rounds micro-batches."""
        cfg, group = self.cfg, self.group
        start = time.perf_counter()
        ranks = group.world if group is not None else 1
        if group is not None:  # this rank's run of the global batch, the global target count
            data = RankSlice(data, group.rank, group.world, cfg.rounds)
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        per_target = 1.0 / max(
            data.target_tokens(step, cfg.rounds * cfg.micro_batch), 1
        )  # the global batch's mean
        for r in range(cfg.rounds):
            inputs, targets = data.batch(step, r, cfg.micro_batch)
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            docs = None
            if cfg.document_mask:  # (positions, segments), each (B, S)
                pos, seg = data.documents(step, r, cfg.micro_batch)
                docs = (pos.to(self.device), seg.to(self.device))
            coef = self.dims.router_aux_loss_coef
            router = (
                RouterTotals(self.dims.num_experts, self.device, cfg.micro_batch, cfg.seq_len)
                if self.dims.is_moe and coef > 0
                else None
            )
            with torch.autocast(self.device.type, torch.bfloat16, enabled=cfg.precision == "mixed"):
                logits = self.model(inputs, router, docs)  # (B, S, V)
            loss = causal_lm_loss(logits, targets, reduction="sum") * per_target
            if router is not None:  # + coef x the mean over the step's sequences (moe.py)
                loss = loss + coef * router.loss() / (ranks * cfg.rounds * cfg.micro_batch)
            loss.backward()
            total += loss.detach()
        if group is not None:  # the one-GPU gradient and loss: sums over the ranks
            group.sum_gradients(self.model.parameters())
            total = group.sum_scalar(total)
        if self.opt_spec.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.opt_spec.grad_clip)
        self.optimizer.step()
        self.schedule.step()
        loss_value = float(total.item())  # .item() synchronises the device
        self._sync()
        return StepStats(
            loss_value,
            time.perf_counter() - start,
            # the global batch's tokens
            step_tokens(ranks * cfg.rounds * cfg.micro_batch, cfg.seq_len),
        )
