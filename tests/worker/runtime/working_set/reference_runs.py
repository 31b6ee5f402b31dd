"""The working-set runtime's tests against Hugging Face: the small models (DIMS and its Qwen3
and MoE kin), a fixed token pool (`Batches`, `DocBatches`), the runtime built on a reference
model's weights (`make_runtime`), and the reference results, each computed once per test
process and shared by every test and hypothesis example that asks for the same one:

- `reference(dims)`: a fresh copy of the reference model of `dims` (built once);
- `check_grads`: the runtime's loss and every gradient against transformers', from one
  cached backward per distinct round of tokens;
- `check_weights_after_steps`: the weights against torch AdamW trained on the reference,
  cached per model, data, plan shape and optimizer.

Cached results are returned as copies or only read, so no test can change what another sees.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
from collections.abc import Iterable
from typing import Protocol

import torch
from transformers import LlamaForCausalLM

from tests.worker.hf_models import (
    aux_per_sequence,
    hf_causal_lm,
    hub_grads,
    hub_state,
    perturb_norms,
)
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import JobSpec, OptimizerSpec
from wstrain.worker.runtime.optim import make_adamw
from wstrain.worker.runtime.working_set.config import WorkingSetConfig
from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime
from wstrain.worker.runtime.working_set.state import HostState

DIMS = ModelDims(101, 48, 80, 4, 4, 2, 12, 1e-5, 10000.0, 128)
SEQ = 16
QWEN3 = ModelDims(101, 48, 80, 3, 4, 2, 16, 1e-6, 1000000.0, 128, model_type="qwen3")
OLMOE = ModelDims(
    101, 48, 0, 3, 4, 4, 12, 1e-5, 10000.0, 128, model_type="olmoe", num_experts=6,
    experts_per_token=2, moe_intermediate_size=20, router_aux_loss_coef=0.02, pad_token_id=1,
)  # fmt: skip
QWEN3_MOE = ModelDims(
    101, 48, 0, 3, 4, 2, 16, 1e-6, 1000000.0, 128, model_type="qwen3_moe", num_experts=8,
    experts_per_token=3, moe_intermediate_size=24, norm_topk_prob=True,
    router_aux_loss_coef=0.05,
)  # fmt: skip
QWEN2_MOE = ModelDims(
    101, 48, 0, 3, 4, 2, 12, 1e-6, 1000000.0, 128, model_type="qwen2_moe", num_experts=6,
    experts_per_token=2, moe_intermediate_size=20, router_aux_loss_coef=0.02,
    shared_expert_intermediate_size=40, qkv_bias=True,
)  # fmt: skip
# a vocabulary large enough that the embedding and head update in ~8 layer-sized slices,
# pipelined through both of the device optimizer's moment slot pairs
BIG_VOCAB = dataclasses.replace(DIMS, vocab_size=3001)
# eps 1e-6, not 1e-8: AdamW moves a weight by about lr·sign(g) wherever |g| >> eps, so with
# eps 1e-8 gradients of ~1e-8, whose sign the fp32 summation order decides, set an error
# floor that follows the reference's kernels (5-7e-5 with transformers 5.23; 1.7e-6 here)
OPT = OptimizerSpec(lr=1e-2, weight_decay=0.1, eps=1e-6, grad_clip=0.5, warmup_steps=2)


class Batches:
    """A fixed token pool; batch(step, round, n) like wstrain.worker.io.data.TokenStream."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.pool = torch.randint(0, vocab, (64, SEQ + 1), generator=g)
        self.seq_len = SEQ

    def batch(self, step: int, round_idx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = (step * 7 + round_idx * n) % (64 - n)
        rows = self.pool[start : start + n]
        return rows[:, :-1], rows[:, 1:]

    def target_tokens(self, step: int, sequences: int) -> int:
        return sequences * self.seq_len


# Each pool row's documents (lengths summing to SEQ = 16): documents that cross pieces of 4
# and 5, one of a single token, a row that is one document
LAYOUTS = [[3, 7, 6], [16], [1, 9, 6], [5, 5, 6], [2, 2, 12], [11, 5]]


class DocBatches(Batches):
    """Batches whose sequences are packed documents: documents(step, round, n) gives
    (positions, segments), (n, S) each, as wstrain.worker.io.data packs them."""

    def _rows(self, step: int, round_idx: int, n: int) -> range:
        start = (step * 7 + round_idx * n) % (64 - n)  # Batches.batch's rows
        return range(start, start + n)

    def documents(self, step: int, round_idx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = [LAYOUTS[i % len(LAYOUTS)] for i in self._rows(step, round_idx, n)]
        pos = [torch.cat([torch.arange(m) for m in row]) for row in lengths]
        seg = [torch.cat([torch.full((m,), d) for d, m in enumerate(row)]) for row in lengths]
        return torch.stack(pos), torch.stack(seg)


class TokenBatches(Protocol):
    def batch(self, step: int, round_idx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]: ...


@functools.cache
def _built(dims: ModelDims) -> tuple[LlamaForCausalLM, torch.Tensor]:
    """The reference model of `dims` and the global RNG state its construction leaves; the
    caller's RNG state is kept."""
    before = torch.get_rng_state()
    torch.manual_seed(1)
    model = hf_causal_lm(dims, "sdpa")
    perturb_norms(model, seed=2)
    after = torch.get_rng_state()
    torch.set_rng_state(before)
    return model, after  # type: ignore[return-value]


def reference(dims: ModelDims) -> LlamaForCausalLM:
    """A copy of transformers' model of `dims` (seed 1, norms perturbed), free to train or
    move; the global RNG is left as building it leaves it, so what a test draws after is
    what it drew when each test built its own."""
    model, rng_after = _built(dims)
    torch.set_rng_state(rng_after)
    return copy.deepcopy(model)


def _token_key(tensors: Iterable[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(repr((tuple(t.shape), t.dtype)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _round_loss(
    model: LlamaForCausalLM, x: torch.Tensor, y: torch.Tensor, rounds: int
) -> torch.Tensor:
    """One round's share of a step of `rounds` (x, y: (n, S)): its mean token loss over
    `rounds`, MoE: with transformers' aux loss of each sequence, weighted 1/(rounds·n) as
    wstrain does (worker/models/moe.py)."""
    out = model(input_ids=x)
    logits = out.logits  # (n, S, V)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss = loss / rounds
    if getattr(out, "aux_loss", None) is not None:
        aux = aux_per_sequence(model, x)
        loss = loss + model.router_aux_loss_coef * aux / (rounds * x.shape[0])
    return loss


# (dims, a digest of the round's tokens, rounds in the step) -> (loss, gradients by Hub
# name) of that round: read only
_ROUNDS: dict[tuple[ModelDims, str, int], tuple[float, dict[str, torch.Tensor]]] = {}


def _round_result(
    dims: ModelDims, x: torch.Tensor, y: torch.Tensor, rounds: int
) -> tuple[float, dict[str, torch.Tensor]]:
    """One round's share of a step of `rounds` (its loss / rounds) on the reference of
    `dims`: the loss and the gradients (Hub names) that round adds."""
    key = (dims, _token_key((x, y)), rounds)
    if key not in _ROUNDS:
        model = copy.deepcopy(_built(dims)[0])
        loss = _round_loss(model, x, y, rounds)
        loss.backward()
        _ROUNDS[key] = loss.item(), {n: g.detach().clone() for n, g in hub_grads(model).items()}
    return _ROUNDS[key]


def reference_step(
    dims: ModelDims, data: TokenBatches, step: int, rounds: int, mb: int
) -> tuple[float, dict[str, torch.Tensor]]:
    """A step's loss and gradients on the reference of `dims`: the mean over `rounds` rounds
    of `mb` sequences, summed in ref_loss_and_grads's order, so equal to it bit for bit.
    Each distinct round of tokens runs through transformers once per test process for each
    number of rounds (a round's backward on these tiny models costs about what the
    runtime's does)."""
    total, grads = 0.0, {}
    for r in range(rounds):
        x, y = (t.cpu() for t in data.batch(step, r, mb))
        loss, g = _round_result(dims, x, y, rounds)
        total += loss
        grads = {n: grads[n] + t for n, t in g.items()} if grads else g
    return total, grads


def ref_loss_and_grads(
    model: LlamaForCausalLM, data: TokenBatches, step: int, rounds: int, mb: int
) -> float:
    """The step's loss on `model` itself, its gradients left in the model's .grad."""
    model.zero_grad()
    total = 0.0
    for r in range(rounds):
        x, y = data.batch(step, r, mb)
        loss = _round_loss(model, x, y, rounds)
        loss.backward()
        total += loss.item()
    return total


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def make_runtime(
    ref: LlamaForCausalLM,
    device: str = "cpu",
    dims: ModelDims = DIMS,
    precision: str = "fp32",
    **kw: object,
) -> WorkingSetRuntime:
    host = HostState.create(dims, precision, pin=device == "cuda")
    host.load_state_dict({k: v.detach().cpu() for k, v in hub_state(ref).items()})
    cfg = WorkingSetConfig(precision=precision, device=device, steps=10, seed=0, seq_len=SEQ, **kw)  # type: ignore[arg-type]
    return WorkingSetRuntime(dims, cfg, OPT, host)


def _starts_from_the_reference(rt: WorkingSetRuntime) -> None:
    """The cached results hold for the runtime only if it starts from reference(rt.dims)."""
    want = hub_state(_built(rt.dims)[0])
    for name, w in rt.host.weight_views().items():
        assert torch.equal(w, want[name].to(w.dtype)), f"{name}: not reference(dims)'s weights"


def check_grads(
    rt: WorkingSetRuntime,
    data: TokenBatches,
    tol: float = 1e-5,
    ref: LlamaForCausalLM | None = None,
) -> None:
    """The loss and every gradient of the runtime's first step against transformers':
    `ref` run here (a model on the runtime's device), or by default reference(rt.dims)'s
    cached result, for a runtime make_runtime built on reference(rt.dims)."""
    cfg = rt.cfg
    if ref is None:
        _starts_from_the_reference(rt)
        want, want_grads = reference_step(rt.dims, data, 0, cfg.rounds, cfg.micro_batch)
    else:
        want = ref_loss_and_grads(ref, data, 0, cfg.rounds, cfg.micro_batch)
        want_grads = hub_grads(ref)
    got = rt.forward_backward(data, 0)
    assert abs(got - want) < tol * abs(want), (got, want)
    grads = rt.host.named_grads()
    for name, want_g in want_grads.items():
        assert rel(grads[name], want_g.cpu()) < tol, (name, rel(grads[name], want_g.cpu()))


def _train_reference(
    ref: LlamaForCausalLM, data: TokenBatches, steps: int, rounds: int, mb: int, total: int
) -> dict[str, torch.Tensor]:
    """`steps` steps of torch AdamW (clipping, a schedule of `total` steps) on `ref` itself,
    `rounds` rounds of `mb` sequences a step; its weights."""
    opt, sched = make_adamw(ref.parameters(), OPT, total)
    for step in range(steps):
        ref_loss_and_grads(ref, data, step, rounds, mb)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), OPT.grad_clip)
        opt.step()
        sched.step()
    return {n: p.detach() for n, p in ref.named_parameters()}


# (dims, a digest of every step's tokens, steps, rounds, micro-batch, schedule steps) ->
# the weights torch AdamW reaches: read only
_TRAINED: dict[tuple[ModelDims, str, int, int, int, int], dict[str, torch.Tensor]] = {}


def check_weights_after_steps(
    rt: WorkingSetRuntime,
    data: TokenBatches,
    steps: int,
    tol: float,
    ref: LlamaForCausalLM | None = None,
) -> None:
    """Train both `steps` steps (reference: torch AdamW, clipping, schedule) and compare:
    `ref` trained here, or by default reference(rt.dims) trained once per process for each
    data, rounds and micro-batch (the runtime must start from its weights)."""
    cfg = rt.cfg
    if ref is None:
        _starts_from_the_reference(rt)
        tokens = (t for s in range(steps) for r in range(cfg.rounds)
                  for t in data.batch(s, r, cfg.micro_batch))  # fmt: skip
        key = (rt.dims, _token_key(tokens), steps, cfg.rounds, cfg.micro_batch, cfg.steps)
        if key not in _TRAINED:
            model = copy.deepcopy(_built(rt.dims)[0])
            _TRAINED[key] = _train_reference(model, data, steps, *key[3:])
        want = _TRAINED[key]
    else:
        want = _train_reference(ref, data, steps, cfg.rounds, cfg.micro_batch, cfg.steps)
    for step in range(steps):
        rt.train_step(data, step)
    weights = rt.state_tensors()  # applies a deferred device update first
    for name, p in want.items():
        assert rel(weights[name], p.cpu()) < tol, name


def fp32_spec(global_batch: int) -> JobSpec:
    """The JobSpec of these tests' runs (DIMS, SEQ tokens, fp32) for the planner's counts."""
    return JobSpec.model_validate(
        {
            "name": "a",
            "model": {"hf_config": DIMS.to_hf_config()},
            "data": {"kind": "synthetic"},
            "seq_len": SEQ,
            "global_batch": global_batch,
            "steps": 1,
            "precision": "fp32",
            "budget": {"device_gib": 1, "host_gib": 1},
        }
    )
