"""The baseline rows of bench/runtime.py: the whole model resident in PyTorch (with or
without full activation checkpointing), FSDP2 with CPUOffloadPolicy and DeepSpeed ZeRO-3
offload, each stepping AdamW over the same global batch of random tokens. Run through the
driver, one process a row:

    python -m bench.runtime --rows resident,resident-ckpt,fsdp2-offload --out X.json

The offload rows run on one GPU, or as rank RANK of WORLD_SIZE (torchrun's environment,
set by bench/data_parallel.py's `fsdp2-N` and `deepspeed-N` rows): each rank then steps
`global_batch` sequences of its own.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.utils.checkpoint import checkpoint

from bench.harness import RandomTokens, pss_bytes, time_steps
from bench.specs import llama_dims
from bench.timeline import profile_step
from wstrain.contracts.calibration import GIB
from wstrain.worker.models.dense import LlamaModel, causal_lm_loss
from wstrain.worker.models.rope import rope_tables

log = logging.getLogger("bench.runtime")


def run_resident(args: argparse.Namespace, ckpt: bool) -> dict[str, object]:
    dims = llama_dims(args.layers)
    with torch.device("cuda"):
        model = LlamaModel(dims).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    mb = args.resident_micro_batch

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = model.model.embed_tokens(x)
        cos, sin = rope_tables(dims, x.shape[1], h.device, h.dtype)
        for layer in model.model.layers:
            h = checkpoint(layer, h, cos, sin, use_reentrant=False) if ckpt else layer(h, cos, sin)
        return model.lm_head(model.model.norm(h))

    step = accumulated_step(
        model, opt, dims.vocab_size, args, mb, lambda x, y: causal_lm_loss(forward(x), y)
    )
    times = time_steps(step, args.steps)
    timeline = profile_step(lambda: step(args.steps)) if args.profile else None
    return {
        "times": times,
        "stalls": {},
        "arena_gib": None,
        "timeline": timeline,
        "plan": {"micro_batch": mb, "rounds": args.global_batch // mb, "checkpointing": ckpt},
    }


def _rank() -> tuple[int, int]:
    """(rank, local rank) from torchrun's environment, one rank on GPU 0 without it; the
    rank's GPU made current."""
    defaults = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0"}
    for key, value in {**defaults, "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    return int(os.environ["RANK"]), local


def accumulated_step(
    model,
    opt,
    vocab: int,
    args: argparse.Namespace,
    micro_batch: int,  # type: ignore[no-untyped-def]
    loss_of: Callable,
) -> Callable[[int], None]:  # type: ignore[type-arg]
    """One whole optimizer step of a plain PyTorch model: global_batch / micro_batch
    micro-batches of random tokens accumulated, clipped to norm 1, one step."""
    data = RandomTokens(vocab, args.seq, "cuda", seed=int(os.environ.get("RANK", "0")))
    rounds = args.global_batch // micro_batch

    def step(i: int) -> None:
        for r in range(rounds):
            x, y = data.batch(i, r, micro_batch)
            (loss_of(x.cuda(), y.cuda()) / rounds).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def run_fsdp2_offload(args: argparse.Namespace) -> dict[str, object]:
    """FSDP2 on one GPU with CPUOffloadPolicy: parameters, gradients and AdamW state live in
    pinned host memory, each layer is all-gathered to the device for its forward and backward
    (full activation checkpointing per layer), and the optimizer steps on the CPU."""
    _rank()
    # gloo beside NCCL: with N ranks the offloaded gradients' clipping norm is reduced on the CPU
    dist.init_process_group("cpu:gloo,cuda:nccl")  # torchrun's environment (one rank without)
    dims = llama_dims(args.layers)
    with torch.device("cuda"):  # fast init; fully_shard then moves the shards home
        model = LlamaModel(dims).to(torch.bfloat16)
    offload = CPUOffloadPolicy(pin_memory=True)
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = checkpoint_wrapper(layer)  # full activation checkpointing
        fully_shard(model.model.layers[i], offload_policy=offload)
    fully_shard(model, offload_policy=offload)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    log.info(
        "FSDP2 model sharded; %.1f GiB left on the device", torch.cuda.memory_allocated() / GIB
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = time_steps(
        accumulated_step(
            model,
            opt,
            dims.vocab_size,
            args,
            1,  # root's fwd
            lambda x, y: causal_lm_loss(model(x), y),
        ),
        args.steps,
    )
    pss = pss_bytes(os.getpid())  # the model, gradients and moments still held
    dist.destroy_process_group()
    return {
        "times": times,
        "pss_bytes": pss,
        "stalls": {},
        "arena_gib": None,
        "plan": {
            "micro_batch": 1,
            "rounds": args.global_batch,
            "checkpointing": True,
            "offload": "FSDP2 CPUOffloadPolicy(pin_memory=True), CPU AdamW",
        },
    }


def _deepspeed_cpu_adam_error() -> str:
    """Build DeepSpeed's own CPU Adam, a C++ extension compiled on first use (it needs a
    compiler and Python's headers on this host): '' when it loads, else why not."""
    try:  # lazy, as in run_deepspeed_zero3_offload: only that row has DeepSpeed installed
        from deepspeed.accelerator import get_accelerator

        get_accelerator().create_op_builder("CPUAdamBuilder").load(verbose=False)
        return ""
    except Exception as exc:  # any build failure: the row steps torch's AdamW and says why
        return f"{type(exc).__name__}: {exc}"[:400]


def run_deepspeed_zero3_offload(args: argparse.Namespace) -> dict[str, object]:
    """DeepSpeed ZeRO-3 on one GPU, parameters and optimizer state offloaded to pinned CPU
    memory, full activation checkpointing per layer (as the FSDP2 row), bf16, one sequence a
    micro-batch, AdamW on the CPU: DeepSpeed's own where its extension builds here, else
    torch's (the row's plan says which, and why)."""
    # lazy: DeepSpeed is no dependency of the project; scripts/device_wheels.sh installs it
    # on the GPU machine for this row alone
    import deepspeed

    os.environ.setdefault("MASTER_PORT", "29518")
    rank, _ = _rank()
    device = deepspeed.get_accelerator().device_name()
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    dims = llama_dims(args.layers)
    build_error = _deepspeed_cpu_adam_error()
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": args.global_batch,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": bool(build_error)}},
        "zero_force_ds_cpu_optimizer": not build_error,
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "cpu", "pin_memory": True},
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        },
    }
    with deepspeed.zero.Init(config_dict_or_path=config, dtype=torch.bfloat16):
        model = LlamaModel(dims)  # each module's weights partitioned to the host as built
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = checkpoint_wrapper(layer)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    data = RandomTokens(dims.vocab_size, args.seq, device, seed=rank)

    def step(i: int) -> None:
        for r in range(args.global_batch):  # DeepSpeed scales by the accumulation itself
            x, y = data.batch(i, r, 1)
            engine.backward(causal_lm_loss(engine(x.to(device)), y.to(device)))
            engine.step()  # the optimizer steps at the accumulation boundary

    times = time_steps(step, args.steps)
    if engine.global_steps != args.steps:  # the accumulation boundary is DeepSpeed's count
        raise RuntimeError(
            f"DeepSpeed stepped its optimizer {engine.global_steps} times in "
            f"{args.steps} steps of {args.global_batch} micro-batches"
        )
    pss = pss_bytes(os.getpid())  # the engine's host partitions still held
    dist.destroy_process_group()
    adam = (
        "DeepSpeedCPUAdam"
        if not build_error
        else f"torch AdamW (DeepSpeedCPUAdam did not build: {build_error})"
    )
    return {
        "times": times,
        "pss_bytes": pss,
        "stalls": {},
        "arena_gib": None,
        "plan": {
            "micro_batch": 1,
            "rounds": args.global_batch,
            "checkpointing": True,
            "offload": "DeepSpeed ZeRO-3, offload_param and offload_optimizer to "
            f"pinned CPU memory; {adam}",
        },
    }
