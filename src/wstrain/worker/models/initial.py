"""A new model's initial weights for a seed: RMSNorm weights (layers, q/k, final) at one, the
rest N(0, std), under Hugging Face's names in parameter order, one fp32 tensor at a time.

Both runtimes start from them: the resident runtime copies them into its modules
(`init_model`), the working set writes them straight into its host tiles
(worker/build.py), so no whole fp32 model is built beside a job's state (a 32 B model's
would be 131 GB beside a 180 GiB host budget).

Each tensor is drawn in blocks of BLOCK_NUMEL, each block from its own generator seeded by
(seed, the tensor's index, the block's index), on a pool of threads: the values depend on
the seed alone, never on the thread count (on one torch build and CPU capability: the
plain and AVX2 paths of `normal_` differ in their low bits). Blocks of the tensors ahead
are drawn while the caller copies the current one, up to AHEAD_BYTES (MoE models hold most
parameters in experts of less than one block each). One CPU generator draws ~200 M values
a second: 160 s for a 32 B model on one thread.

    for name, value in initial_weights(dims, seed): tiles[name].copy_(value)
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import nn

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.dense import LlamaModel

BLOCK_NUMEL = 1 << 22  # 16 MiB of fp32: ~20 ms of drawing, enough to amortise a task
AHEAD_BYTES = 1 << 30  # fp32 drawn ahead of the caller, beyond the tensor it is given


def _block_seed(seed: int, tensor: int, block: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{tensor}:{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes 63 bits


def _draw_block(flat: torch.Tensor, seed: int, tensor: int, block: int, std: float) -> None:
    gen = torch.Generator().manual_seed(_block_seed(seed, tensor, block))
    flat[block * BLOCK_NUMEL : (block + 1) * BLOCK_NUMEL].normal_(0.0, std, generator=gen)


def initial_weights(
    dims: ModelDims, seed: int, std: float = 0.02, threads: int | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, fp32 tensor) for every parameter of `dims`' model, in parameter order;
    `threads` draw them (default: torch's intra-op threads, the worker's --threads)."""
    with torch.device("meta"):  # names and shapes only: no memory, no default init
        shapes = [(n, p.shape) for n, p in LlamaModel(dims).named_parameters()]
    workers = threads or torch.get_num_threads()
    # (name, tensor, its blocks' futures) submitted, in order; torch's CPU kernels release
    # the GIL, and each block's normal_ runs on its own thread
    ahead: deque[tuple[str, torch.Tensor, list[Future[None]]]] = deque()
    ahead_bytes, following = 0, 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while ahead or following < len(shapes):
            while following < len(shapes) and (not ahead or ahead_bytes < AHEAD_BYTES):
                name, shape = shapes[following]
                if name.endswith("norm.weight"):
                    value, futures = torch.ones(shape), []
                else:
                    value = torch.empty(shape)
                    flat, blocks = value.view(-1), -(-value.numel() // BLOCK_NUMEL)
                    futures = [
                        pool.submit(_draw_block, flat, seed, following, b, std)
                        for b in range(blocks)
                    ]
                ahead.append((name, value, futures))
                ahead_bytes += value.numel() * 4
                following += 1
            name, value, futures = ahead.popleft()
            ahead_bytes -= value.numel() * 4
            for f in futures:
                f.result()  # a block's error surfaces here
            yield name, value
            del value  # the caller's copy is the only one left


def init_model(model: nn.Module, dims: ModelDims, seed: int, std: float = 0.02) -> None:
    """A `LlamaModel` (any dtype, any device) set to `initial_weights(dims, seed, std)`."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in initial_weights(dims, seed, std):
            params[name].copy_(value)
