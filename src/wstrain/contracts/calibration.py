"""Every measured or chosen number that the planner and the worker share, defined once.

The planner predicts with these and the worker sizes its buffers with the same ones, so a
plan's memory prediction and the process that runs it cannot drift apart. Each number says
where it was measured; `bench/RESULTS.md` has the rows behind them. Pure constants: this
module imports nothing, so the API, the agent and the worker all read it.

    from wstrain.contracts.calibration import GIB, DEVICE_RESERVE_BYTES
"""

from __future__ import annotations

from typing import Final

MIB: Final = 1 << 20
GIB: Final = 1 << 30

# Bytes of one streamed element by precision: bf16 state, "mixed" (bf16 weights and
# gradients computed and streamed, fp32 master on the host) and fp32.
ELEMENT_BYTES: Final = {"bf16": 2, "mixed": 2, "fp32": 4}

# Saved-activation levels of a (layer, chunk): 0 the input only, 1 + the attention kernel's
# set, 2 + the MLP's lean set, 3 both (working_set/schedule.py).
LEVELS: Final = 4

# ----------------------------------------------------------------- device memory

# Fixed device reserve beside what the memory models count: kernel workspaces, cuBLAS and
# cuDNN handles, RNG and loss scalars. 512 MiB keeps the working-set rows' reserved peak
# under their 12-24 GiB budgets on the H200 (bench/RESULTS.md, fused kernels).
DEVICE_RESERVE_BYTES: Final = 512 * MIB
# The caching allocator's reserved peak over the bytes we count: the resident 16-layer
# Llama-8B row reserved 73.0 GiB where the counted terms add up to 64.5 (H200); the
# working-set rows fit 1.18 as well. Budgets are a contract, so over-predict.
ALLOCATOR_SLACK: Final = 1.18
# Workspace of one layer's forward and backward over the resident model's saved bytes for
# one sequence (transient GEMM and attention buffers; H200, Llama-8B at 8K).
LAYER_WORKSPACE_FACTOR: Final = 1.3

# document_mask: device bytes per (query, key) pair of each sequence a round holds — the
# dense bool mask and the masked SDPA kernel's buffers. An H100 at 8K tokens (Llama-8B dims,
# bench/documents.py) peaked 1.0 GiB higher with the mask for a resident micro-batch of 2
# (8 bytes a pair) and 0.4 GiB for a working-set round of 4 (1.6): the larger is planned.
DOCUMENT_MASK_BYTES_PER_PAIR: Final = 8

# ----------------------------------------------------------------- host memory

# Host memory of a worker process before any model state: interpreter, torch, CUDA context
# and runtime libraries (measured 5.2 GiB RSS on the H200 host; a CPU worker ~0.7 GiB).
PROCESS_BYTES: Final = {"cuda": int(5.5 * GIB), "cpu": 768 * MIB}
# Checkpoints are written one safetensors shard at a time, each copied out of the training
# state only while it is written: this bounds the host memory a save adds.
CHECKPOINT_SHARD_BYTES: Final = GIB
# Keys per call of a long sequence's attention backward (worker/ops/prefix_attn.py): FA2's
# backward expands grouped K/V gradients to every query head (bf16, 2 x keys x H x hd), 4
# GiB each at 512K for Llama-8B; in blocks of 64K keys that is 1 GiB in all.
ATTENTION_KEY_BLOCK_TOKENS: Final = 65536
# A long sequence's pieces add their attention gradients into fp32 sums (the same file):
# each piece dK and dV of every key up to its end, dQ once per key block's call, in one
# coalesced pass each (worker/kernels/fused.py add_into). Measured on an H200, one layer at
# 128K in 8K pieces: 28.2 GB read and written in 6.83 ms, 4.12 TB/s (eager PyTorch's
# strided casting add: 1.95; bench/results/long-context/piece-backward-sums-h200-2026-11-29.json),
# so finer pieces, which re-add the prefix's gradients more often, cost that much more. An
# H100's HBM (3.35 TB/s) caps it lower there: its plans undercount the sums by ~0.1 s a
# 128K step of 32 layers (0.3%).
PIECE_SUMS_BYTES_PER_S: Final = 4.12e12
# fp8 saved activations (working_set/fp8_saves.py): one fp32 scale per this many elements,
# so a 16-bit element goes home in 1 + 4/128 bytes.
FP8_BLOCK_ELEMENTS: Final = 128
# Saved activations in flight to the host at most (the D2H write buffer) by default: a
# forward that would exceed it waits for the oldest copy. The planner may take 2 or 4 GiB
# for whole sequences whose set outgrows it (planning/layouts.py write_buffers).
WRITE_BUFFER_BYTES: Final = GIB
# The host activation store's chunk: sets are placed first-fit in 64 MiB chunks, so it
# holds at most a part-used last chunk and small tails beyond the sets (simulated at 8K on
# the H200 plans: 0-45 MiB over 13-33 GiB of sets).
ACTIVATION_CHUNK_BYTES: Final = 64 * MIB
# The disk tier (WorkingSetPlan.spilled_layers): a spilled layer's AdamW moments (m, v) come
# into one of SPILL_SLOTS host slots (one updating, one reading ahead or writing back; the
# host counts both), in direct-I/O blocks of SPILL_IO_BLOCK_BYTES on SPILL_IO_THREADS threads
# (a virtio disk read 1.6 and wrote 2.2 GB/s in 16 MiB blocks on the lent H200).
SPILL_SLOTS: Final = 2
SPILL_IO_BLOCK_BYTES: Final = 16 * MIB
SPILL_IO_THREADS: Final = 4
SPILL_ALIGN_BYTES: Final = 4096  # direct I/O: buffers, offsets and lengths at 4 KiB
# every tensor view starts 256-byte aligned (bf16) inside a host tile (its padding counted
# in the spill records, planning/spill.py)
ALIGN_ELEMS: Final = 128

# ----------------------------------------------------------------- time

# A layer's compute inside the working-set runtime over the same layer timed alone
# (worker/profile/layer.py): saved-tensor hooks, slot binding, stream waits, launch gaps
# and the lean backwards' elementwise work. Fitted on five H200 bench rows (measured over
# predicted 1.05-1.08 at 1.15 before the fit); with the fused kernels eight rows predict
# -2.6% to +2.2% of the measured step.
RUNTIME_OVERHEAD: Final = 1.22
# A flash attention backward over its forward, in time: five matmuls to two (the
# forward's scores are recomputed). The node profile's attention rate counts AdaWS's FLOPs
# (the backward twice the forward: 3 forwards' worth) over the timed forward and backward,
# so a forward takes 3 / (1 + 2.5) of its FLOPs at that rate (taken as 1 / 3, attention
# would cost 3.5 / 3 = 1.17x its kernels' time: 1M tokens at 16 layers, +13.9%).
ATTENTION_BACKWARD_RATIO: Final = 2.5
# The runtime's attention calls over the same kernels timed alone (node profile): a
# piece's launches, its log-sum-exp merges, stream waits. Fitted on the 29 long-context
# rows timed after a warm-up before it, H100 and H200, 32K-256K (bench/replan.py): at
# 1.10 they predict -8.2% to +6.0% of the measured step, mean error 2.2% (1.0: 4.7%,
# -9.6% to +0.7%; 1.15: 3.7%); the 128K row measured after it: +6.3%.
ATTENTION_OVERHEAD: Final = 1.10
# Share of the D2H link planned for saved activations; gradients and the device optimizer
# share the rest. With the rolling backward prefetch 80% ran 18.0 s a step against 17.7 s
# predicted (H200, 20 GiB budget).
LINK_SHARE: Final = 0.8
# Share of the two-way rate each direction gets while a forward runs beside a backward
# (cross-round overlap: sets and gradients out, weights, accumulated gradients and sets in,
# at once). Fitted on the H200's four overlap rows of 2026-11-27 (bench/RESULTS.md): at 0.7
# they predict -3.5% to +3.9% of the measured step; at 0.8 (LINK_SHARE) -5.2% to -15%.
PAIRED_LINK_SHARE: Final = 0.7
# The SwiGLU GEMMs a backward recomputes when the MLP's lean set was not saved: gate and
# up, two of three (the down projection's output is never needed).
MLP_RECOMPUTED_SHARE: Final = 2 / 3
# The MLP's share of a layer's backward (Llama-8B at 8K: its GEMMs are 3/4 of the FLOPs).
MLP_BACKWARD_SHARE: Final = 0.7
# A mixed-precision host AdamW update over a bf16 one, per parameter. Memory traffic alone
# gives 40 / 14 bytes = 2.86x; measured with the runtime's 15 threads
# (bench/host_adamw.py): 93.9 against 28.6 ms a layer on one H200 host (3.28x), 73.4
# against 38.8 on another (1.89x). The planner keeps the larger.
MIXED_UPDATE_SLOWDOWN: Final = 93.9 / 28.6
# A resident AdamW step on a GPU: one fused kernel reading and writing ~14 bytes a
# parameter of bf16 state at ~3 TB/s of HBM (H100/H200).
DEVICE_ADAMW_BYTES_PER_PARAM: Final = 14
DEVICE_MEMORY_BYTES_PER_S: Final = 3e12
# Data parallel: the bus bandwidth of a ring all-reduce between the GPUs of one node, as
# nccl-tests reports it (busbw = algbw x 2(N-1)/N, so the time of S gradient bytes is
# 2(N-1)/N x S / busbw): ~370 GB/s on H100 SXM over NVLink 4 (all_reduce_perf, large
# messages). On CPU the ranks reduce through gloo in host memory at the node's measured
# memcpy rate (its profile's h2d_bytes_per_s) instead.
ALLREDUCE_BUS_BYTES_PER_S: Final = 370e9


def host_reserve_bytes(params: int, precision: str, device: str) -> int:
    """Host memory a worker needs beside its arena: the process and the checkpoint shard
    being written (copied from the fp32 master in mixed precision). The planner counts it
    and the worker caps its arena at the host budget less it."""
    element = 4 if precision == "mixed" else ELEMENT_BYTES[precision]
    return PROCESS_BYTES[device] + min(CHECKPOINT_SHARD_BYTES, params * element)


def host_arena_limit_bytes(host_budget_bytes: int, params: int, precision: str, device: str) -> int:
    """What a working-set worker's host arena may hold in all: the job's host budget less
    host_reserve_bytes. The worker caps its arena here (worker/build.py, bench/runtime.py);
    the planner counts the same reserve (planning/memory_model.py host_bytes), so a one-rank
    plan's arena (its state and saved sets) fits under this limit."""
    return host_budget_bytes - host_reserve_bytes(params, precision, device)
