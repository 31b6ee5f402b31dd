"""The hardware profile of this host, printed as JSON for the scheduler agent.

    python -m wstrain.worker.profile.node [--cache-dir DIR]   # ~2 s on a CPU host, ~10 s on an H200
    python -m wstrain.worker.profile.node --spill-dir DIR     # + disk rates (profile/disk.py)

Measures what the autoconfigurator's cost model needs (planning/working_set.py):
pinned host->device, device->host and both-at-once copy bandwidth (on a CPU host the "link"
is a host memcpy; on several GPUs also each one's D2H rate while 2..N copy at once), host
memcpy bandwidth, practical matmul FLOP/s at a decoder layer's GEMM shape, causal-attention
FLOP/s at several sequence lengths (SDPA's, and FlashAttention-3's where its wheel runs
here: the kernel a long sequence's pieces take, ops/fa3_attn.py), the loss's logits per
second (fp32 cross-entropy, memory-bound), and CPU AdamW parameter updates per second; it
lists the GPUs. The agent caches the result per (GPU model, driver, torch, FA3 present) key.
On a GPU that the chip table (contracts/chips.py) does not know, the bf16 matmul rate is
also what a job's MFU divides by.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from wstrain.contracts.hardware import FA3_PROFILE_KEY, cpu_profile_cache_key, profile_cache_key
from wstrain.worker.ops.fa3_attn import fa3_block_backward, fa3_forward, fa3_present
from wstrain.worker.profile.disk import disk_bandwidth
from wstrain.worker.profile.shared_links import d2h_by_gpus


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn: Callable[[], object], repeats: int) -> float:
    """Seconds per call after one warm-up call."""
    fn()
    _sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync()
    return (time.perf_counter() - start) / repeats


def _pinned(nbytes: int) -> torch.Tensor:
    host = torch.empty(nbytes, dtype=torch.uint8)
    if torch.cuda.is_available():
        torch.cuda.cudart().cudaHostRegister(host.data_ptr(), nbytes, 0)
    return host


# the GEMM rate's tokens on a GPU, an 8K-token MLP projection (bench/long_context.py times
# its floor at held clocks at the same shape)
GPU_GEMM_TOKENS = 8192


def link_bandwidth(nbytes: int) -> dict[str, float]:
    """Bytes/s of pinned H2D, D2H, and each direction while both run on two streams."""
    host_in, host_out = _pinned(nbytes), _pinned(nbytes)
    if not torch.cuda.is_available():
        dev = torch.empty(nbytes, dtype=torch.uint8)
        memcpy = nbytes / _time(lambda: dev.copy_(host_in), 5)
        return {
            "h2d_bytes_per_s": memcpy,
            "d2h_bytes_per_s": memcpy,
            "both_bytes_per_s": memcpy / 2,
        }
    dev_in = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev_out = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d = nbytes / _time(lambda: dev_in.copy_(host_in, non_blocking=True), 5)
    d2h = nbytes / _time(lambda: host_out.copy_(dev_out, non_blocking=True), 5)
    s_in, s_out = torch.cuda.Stream(), torch.cuda.Stream()

    def both() -> None:
        with torch.cuda.stream(s_in):
            dev_in.copy_(host_in, non_blocking=True)
        with torch.cuda.stream(s_out):
            host_out.copy_(dev_out, non_blocking=True)

    both_s = _time(both, 5)
    for t in (host_in, host_out):
        torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
    return {"h2d_bytes_per_s": h2d, "d2h_bytes_per_s": d2h, "both_bytes_per_s": nbytes / both_s}


def host_memcpy(nbytes: int) -> float:
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return nbytes / _time(lambda: dst.copy_(src), 5)


def matmul_call(
    dev: torch.device, dtype: torch.dtype, tokens: int, hidden: int, ffn: int
) -> tuple[Callable[[], object], float]:
    """One (tokens, hidden) x (hidden, ffn) GEMM, an MLP projection's shape, and its FLOPs."""
    a = torch.randn(tokens, hidden, device=dev, dtype=dtype)
    b = torch.randn(hidden, ffn, device=dev, dtype=dtype)
    return (lambda: a @ b), 2.0 * tokens * hidden * ffn


def matmul_flops(
    dev: torch.device, dtype: torch.dtype, tokens: int, hidden: int, ffn: int
) -> float:
    """matmul_call's FLOP/s."""
    fn, flops = matmul_call(dev, dtype, tokens, hidden, ffn)
    return flops / _time(fn, 10)


def attention_flops(
    dev: torch.device, dtype: torch.dtype, seq: int, heads: int, kv_heads: int, head_dim: int
) -> float:
    """FLOP/s of causal SDPA forward + backward for one sequence, counted as AdaWS counts
    attention: 2·S²·nQ·hd forward (causal half of 4·S²·nQ·hd), backward twice that."""
    q = torch.randn(1, heads, seq, head_dim, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(1, kv_heads, seq, head_dim, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    grad = torch.randn(1, heads, seq, head_dim, device=dev, dtype=dtype)

    def fwd_bwd() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(grad)

    flops = 3 * 2 * seq * seq * heads * head_dim  # fwd 2·S²·nQ·hd (causal), bwd 2x fwd
    return flops / _time(fwd_bwd, 3)


def fa3_attention_flops(seq: int, heads: int, kv_heads: int, head_dim: int) -> float:
    """attention_flops' rate for FlashAttention-3's causal forward and backward, called as
    a piece calls them (ops/prefix_attn.py): FLOPs counted the same way."""
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    q = torch.randn(1, heads, seq, head_dim, device=dev, dtype=bf16)
    k = torch.randn(1, kv_heads, seq, head_dim, device=dev, dtype=bf16)
    v = torch.randn_like(k)
    grad = torch.randn_like(q)

    def fwd_bwd() -> None:
        out, lse = fa3_forward(q, k, v)
        fa3_block_backward(grad, q, out, lse, k, v, True)

    return 3 * 2 * seq * seq * heads * head_dim / _time(fwd_bwd, 3)


def loss_logits_per_s(dev: torch.device, dtype: torch.dtype, tokens: int, vocab: int) -> float:
    """Logits a second through the loss as the runtimes compute it on one token block
    (working_set/layer_passes.py _head_loss): the logits cast to fp32, cross-entropy's
    forward and backward, the gradient cast back. Memory-bound, so per logit."""
    logits = torch.randn(tokens, vocab, device=dev, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,), device=dev)

    def fwd_bwd() -> None:
        F.cross_entropy(logits.float(), targets, reduction="sum").backward()
        logits.grad = None

    return tokens * vocab / _time(fwd_bwd, 5)


def optimizer_params_per_s(numel: int) -> float:
    """Host AdamW updates per second as working_set/host_optim.py runs them on the working set's
    tiles (HostState.step_group): bf16 state, clipping, then fused CPU AdamW (the global norm
    is summed on the device)."""
    p = torch.nn.Parameter(torch.randn(numel, dtype=torch.bfloat16))
    p.grad = torch.randn_like(p)
    try:
        opt = torch.optim.AdamW([p], fused=True)
        opt.step()
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW([p])

    def step() -> None:
        p.grad.mul_(0.999)  # type: ignore[union-attr]
        opt.step()

    return numel / _time(step, 3)


def _gpus() -> list[dict[str, object]]:
    gpus = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        gpus.append(
            {
                "index": i,
                "name": torch.cuda.get_device_name(i),
                "total_bytes": total,
                "free_bytes": free,
            }
        )
    return gpus


def cache_key() -> str:
    """What a cached profile is valid for (contracts/hardware.py profile_cache_key)."""
    if not torch.cuda.is_available():
        return cpu_profile_cache_key(os.cpu_count() or 1, torch.__version__)
    driver = str(
        torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else torch.version.cuda
    )
    return profile_cache_key(
        torch.cuda.get_device_name(0), driver, torch.__version__, fa3_present()
    )


def profile() -> dict[str, object]:
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    # Llama-3-8B shapes on a GPU; small ones keep a CPU host's profile to a couple of seconds.
    tokens, hidden, ffn = (GPU_GEMM_TOKENS, 4096, 14336) if cuda else (256, 256, 1024)
    heads, kv_heads, head_dim = (32, 8, 128) if cuda else (4, 2, 64)
    seqs = (2048, 4096, 8192, 16384, 32768) if cuda else (128, 256, 512)
    start = time.perf_counter()
    measured: dict[str, float] = link_bandwidth((512 if cuda else 64) << 20)
    measured["host_memcpy_bytes_per_s"] = host_memcpy(256 << 20 if cuda else 64 << 20)
    measured.update(d2h_by_gpus(1 << 30, 5))  # several GPUs: D2H with 2..N copying at once
    measured["matmul_flops"] = matmul_flops(dev, dtype, tokens, hidden, ffn)
    for seq in seqs:
        measured[f"attention_flops.{seq}"] = attention_flops(
            dev, dtype, seq, heads, kv_heads, head_dim
        )
    if cuda and fa3_present():
        for seq in seqs:
            measured[f"attention_flops.{FA3_PROFILE_KEY}.{seq}"] = fa3_attention_flops(
                seq, heads, kv_heads, head_dim
            )
    # Llama-3's vocabulary in the default 2,048-token block on a GPU (2 GiB of fp32 logits)
    measured["loss_logits_per_s"] = loss_logits_per_s(
        dev, dtype, 2048 if cuda else 256, 128256 if cuda else 8192
    )
    measured["optimizer_params_per_s"] = optimizer_params_per_s(256 << 20 if cuda else 4 << 20)
    measured["cpu_threads"] = float(torch.get_num_threads())
    measured["host_cpus"] = float(os.cpu_count() or 1)
    measured["profile_seconds"] = time.perf_counter() - start
    return {
        "device": "cuda" if cuda else "cpu",
        "gpus": _gpus() if cuda else [],
        "key": cache_key(),
        "profile": measured,
    }


def cached_profile(cache_dir: Path | None) -> dict[str, object]:
    """The profile from cache_dir/<cache_key>.json when present, else measured and saved."""
    if cache_dir is None:
        return profile()
    path = cache_dir / f"{cache_key()}.json"
    if path.exists():
        found = json.loads(path.read_text())
        found["gpus"] = _gpus()  # free memory changes; the measured ceilings do not
        found["cached"] = True
        return found
    measured = profile()
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(measured))
    tmp.rename(path)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, help="reuse/save profiles here")
    parser.add_argument(
        "--spill-dir",
        type=Path,
        help="the disk tier's directory: its read and write rates join the profile, measured "
        "each time (a directory is no part of the cache key)",
    )
    args = parser.parse_args()
    found = cached_profile(args.cache_dir)
    if args.spill_dir is not None:
        found.update(disk_bandwidth(args.spill_dir))
    json.dump(found, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
