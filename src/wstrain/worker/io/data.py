"""Training data for a job: synthetic tokens, a memory-mapped token file (raw .bin or .npy,
uint16/uint32), or text — plain or JSON Lines documents packed with an end-of-text token
between them — with a tokenizer ("byte" or a tokenizers tokenizer.json).

The order is a pure function of (seed, step, round): batch(step) reads the same sequences
whenever it is asked, so the data position in a checkpoint is just the step, and a resumed
run continues with exactly the next batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from wstrain.scheduler.contracts.access import DataAccess
from wstrain.scheduler.contracts.documents import documents
from wstrain.scheduler.contracts.jobs import (
    END_OF_TEXT_TOKENS,
    DataRef,
    SyntheticData,
    TextData,
    TokenData,
)


def _load_tokens(data: DataRef, vocab_size: int, seed: int, access: DataAccess) -> np.ndarray:
    """The job's token ids, every file opened through `access` (under a data root, outside
    the state dir, checked on the file actually opened)."""
    if isinstance(data, SyntheticData):
        rng = np.random.default_rng(seed)
        return rng.integers(0, vocab_size, size=1 << 20, dtype=np.int64)
    if isinstance(data, TokenData):
        with access.open(data.path, "data.path") as path:
            if data.path.endswith(".npy"):
                tokens = np.load(path, mmap_mode="r").reshape(-1)
            else:
                tokens = np.memmap(path, dtype=np.dtype(data.dtype), mode="r")
        _check_ids(tokens, vocab_size, data.path)
        return tokens
    assert isinstance(data, TextData)
    jsonl = data.path.endswith(".jsonl")
    with access.open(data.path, "data.path") as path:
        if data.tokenizer == "byte":
            if not jsonl:
                with open(path, "rb") as f:
                    return np.frombuffer(f.read(), dtype=np.uint8)
            packed = b"".join(doc.encode() + b"\0" for doc in documents(path, data.text_field))
            return np.frombuffer(packed, dtype=np.uint8)
        from tokenizers import Tokenizer  # only text jobs with a tokenizer.json need it

        with access.open(data.tokenizer, "data.tokenizer") as tok_path:
            tok = Tokenizer.from_file(tok_path)
        if not jsonl:
            with open(path, encoding="utf-8") as f:
                return np.asarray(tok.encode(f.read()).ids, dtype=np.int64)
        eos = end_of_text_id(tok)
        ids: list[int] = []
        for doc in documents(path, data.text_field):
            ids.extend(tok.encode(doc).ids)
            ids.append(eos)
        return np.asarray(ids, dtype=np.int64)


def _check_ids(tokens: np.ndarray, vocab_size: int, path: str) -> None:
    """Every id below vocab_size (the API read only the file's head): an embedding lookup
    past the vocabulary would fail deep in a step, or on a GPU corrupt memory."""
    for start in range(0, len(tokens), SCAN_TOKENS):
        block = tokens[start : start + SCAN_TOKENS]
        top = int(block.max())
        if top >= vocab_size:
            at = start + int(np.argmax(block >= vocab_size))
            raise ValueError(
                f"data.path={path!r} holds token id {top} (first bad one at position {at}) "
                f"but the model's vocab_size is {vocab_size}; use a model with a larger "
                "vocabulary or the tokenizer the file was made with"
            )


def end_of_text_id(tok: object) -> int:
    for name in END_OF_TEXT_TOKENS:
        found = tok.token_to_id(name)  # type: ignore[attr-defined]
        if found is not None:
            return int(found)
    raise ValueError(
        f"the tokenizer has none of the end-of-text tokens {END_OF_TEXT_TOKENS}; "
        "packing documents needs one"
    )


# ids checked per block: 256 MiB of uint32, bounded memory whatever the file's size
SCAN_TOKENS = 1 << 26


@dataclass
class TokenStream:
    tokens: np.ndarray  # (N,) token ids for training
    seq_len: int
    seed: int
    heldout: np.ndarray | None = None  # the data's tail, kept out of training

    @classmethod
    def open(
        cls,
        data: DataRef,
        vocab_size: int,
        seq_len: int,
        seed: int,
        heldout_fraction: float = 0.0,
        access: DataAccess | None = None,
    ) -> TokenStream:
        """The job's data; files are read through `access` (default: anywhere)."""
        tokens = _load_tokens(data, vocab_size, seed, access or DataAccess.of(["/"], None))
        cut = len(tokens) - int(len(tokens) * heldout_fraction)
        train, heldout = tokens[:cut], (tokens[cut:] if heldout_fraction else None)
        for name, part in (("training", train), ("held-out", heldout)):
            if part is not None and len(part) < seq_len + 1:
                raise ValueError(
                    f"the {name} data holds {len(part)} tokens, fewer than one "
                    f"sequence of seq_len+1={seq_len + 1}; use more data, a "
                    "shorter seq_len or another eval.heldout_fraction"
                )
        return cls(train, seq_len, seed, heldout)

    def eval_batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same n held-out sequences at every evaluation, spread over the split."""
        assert self.heldout is not None, "no held-out split was asked for"
        span = len(self.heldout) - self.seq_len - 1
        starts = np.linspace(0, span, n).astype(np.int64)
        return self._rows(self.heldout, starts)

    def batch(
        self, step: int, round_idx: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (micro_batch, seq_len) int64."""
        rng = np.random.default_rng([self.seed, step, round_idx])
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, size=micro_batch)
        return self._rows(self.tokens, starts)

    def _rows(self, tokens: np.ndarray, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.stack(
            [np.asarray(tokens[s : s + self.seq_len + 1], dtype=np.int64) for s in starts]
        )  # (B, S+1)
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()
