"""A new model's initial weights for a seed: RMSNorm weights (layers, q/k, final) at one, the
rest N(0, std), under Hugging Face's names in parameter order, one fp32 tensor at a time.

Both runtimes start from them: the resident runtime copies them into its modules
(`init_model`), the working set writes them straight into its host tiles
(worker/build.py), so no whole fp32 model is built beside a job's state (a 32 B model's
would be 131 GB beside a 180 GiB host budget).

Each tensor is drawn in blocks of BLOCK_NUMEL, each block from its own generator seeded by
(seed, the tensor's index, the block's index), on a pool of threads: the values depend on
the seed alone, never on the thread count, and a 16-core host draws them about as many
times faster than one generator could (one CPU generator draws ~200 M values a second: 160
s for a 32 B model).

    for name, value in initial_weights(dims, seed): tiles[name].copy_(value)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.dense import LlamaModel

BLOCK_NUMEL = 1 << 22  # 16 MiB of fp32: ~20 ms of drawing, enough to amortise a task


def _block_seed(seed: int, tensor: int, block: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{tensor}:{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes 63 bits


def _draw(out: torch.Tensor, seed: int, tensor: int, std: float, pool: ThreadPoolExecutor) -> None:
    flat = out.view(-1)

    def block(b: int) -> None:
        gen = torch.Generator().manual_seed(_block_seed(seed, tensor, b))
        flat[b * BLOCK_NUMEL : (b + 1) * BLOCK_NUMEL].normal_(0.0, std, generator=gen)

    blocks = (flat.numel() + BLOCK_NUMEL - 1) // BLOCK_NUMEL
    list(pool.map(block, range(blocks)))  # each block's errors surface here


def initial_weights(
    dims: ModelDims, seed: int, std: float = 0.02, threads: int | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, fp32 tensor) for every parameter of `dims`' model, in parameter order;
    `threads` draw them (default: one a core this process may run on)."""
    with torch.device("meta"):  # names and shapes only: no memory, no default init
        shapes = [(n, p.shape) for n, p in LlamaModel(dims).named_parameters()]
    # torch's CPU kernels release the GIL; each thread's own op runs on one core
    with ThreadPoolExecutor(max_workers=threads or len(os.sched_getaffinity(0))) as pool:
        for i, (name, shape) in enumerate(shapes):
            if name.endswith("norm.weight"):
                yield name, torch.ones(shape)
                continue
            value = torch.empty(shape)
            _draw(value, seed, i, std, pool)
            yield name, value


def init_model(model: nn.Module, dims: ModelDims, seed: int, std: float = 0.02) -> None:
    """A `LlamaModel` (any dtype, any device) set to `initial_weights(dims, seed, std)`."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in initial_weights(dims, seed, std):
            params[name].copy_(value)
