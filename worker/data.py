"""Training data for a job: synthetic tokens, a memory-mapped token file (raw .bin or .npy,
uint16/uint32), or text with a tokenizer ("byte" or a tokenizers tokenizer.json).

The order is a pure function of (seed, step, round): batch(step) reads the same sequences
whenever it is asked, so the data position in a checkpoint is just the step, and a resumed
run continues with exactly the next batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from scheduler.contracts import DataRef, SyntheticData, TextData, TokenData


def _load_tokens(data: DataRef, vocab_size: int, seed: int) -> np.ndarray:
    if isinstance(data, SyntheticData):
        rng = np.random.default_rng(seed)
        return rng.integers(0, vocab_size, size=1 << 20, dtype=np.int64)
    if isinstance(data, TokenData):
        if data.path.endswith(".npy"):
            return np.load(data.path, mmap_mode="r").reshape(-1)
        return np.memmap(data.path, dtype=np.dtype(data.dtype), mode="r")
    assert isinstance(data, TextData)
    if data.tokenizer == "byte":
        with open(data.path, "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8)
    from tokenizers import Tokenizer  # only text jobs with a tokenizer.json need it

    tok = Tokenizer.from_file(data.tokenizer)
    with open(data.path, encoding="utf-8") as f:
        return np.asarray(tok.encode(f.read()).ids, dtype=np.int64)


@dataclass
class TokenStream:
    tokens: np.ndarray  # (N,) token ids
    seq_len: int
    seed: int

    @classmethod
    def open(cls, data: DataRef, vocab_size: int, seq_len: int, seed: int) -> TokenStream:
        tokens = _load_tokens(data, vocab_size, seed)
        if len(tokens) < seq_len + 1:
            raise ValueError(f"the data holds {len(tokens)} tokens, fewer than one sequence "
                             f"of seq_len+1={seq_len + 1}")
        return cls(tokens, seq_len, seed)

    def batch(self, step: int, round_idx: int,
              micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (micro_batch, seq_len) int64."""
        rng = np.random.default_rng([self.seed, step, round_idx])
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, size=micro_batch)
        rows = np.stack([np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64)
                         for s in starts])  # (B, S+1)
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()
