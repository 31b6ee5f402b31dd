"""Training data for a job: synthetic tokens, a memory-mapped token file (raw .bin or .npy,
uint16/uint32), or text — plain or JSON Lines documents packed with an end-of-text token
between them — with a tokenizer ("byte" or a tokenizers tokenizer.json).

The order, the same under any plan: the token stream is cut into consecutive sequences of
seq_len inputs (the label of a sequence's last input is the next one's first token, so every
token but the first is a target once an epoch). Each epoch visits all of them in a
permutation drawn from (seed, epoch), or in file order without shuffle. Step k trains on the
next global_batch sequences of that order, positions [k*G, (k+1)*G); only then are they cut
into rounds of micro-batches, round r taking the r-th run of micro_batch of them. So a plan
(micro-batch, rounds, runtime) changes nothing about which sequences a step sees, and the
data position in a checkpoint is step * G: a resumed run continues with exactly the next
batch.

Documents: where the data knows its document boundaries (a prepared token file's .idx, the
end-of-text tokens of text the worker packed), `documents(step, round, mb)` gives each
token's position within its document and its document's index within the sequence, for
`document_mask: true` (attention within a document, positions restarting at each one; a
document cut by a sequence's start restarts at 0 there, as it can see nothing before).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from wstrain.contracts.access import DataAccess
from wstrain.contracts.documents import documents, end_of_text_id
from wstrain.contracts.spec import DataRef, SyntheticData, TextData, TokenData
from wstrain.contracts.token_file import index_path, token_dtype


def _load_tokens(
    data: DataRef, vocab_size: int, seed: int, access: DataAccess
) -> tuple[np.ndarray, np.ndarray | None]:
    """The job's token ids and its documents' end offsets (None where unknown), every file
    opened through `access` (under a data root, outside the state dir, checked on the file
    actually opened)."""
    if isinstance(data, SyntheticData):
        rng = np.random.default_rng(seed)
        return rng.integers(0, vocab_size, size=1 << 20, dtype=np.int64), None
    if isinstance(data, TokenData):
        ends = None
        with access.open(data.path, "data.path") as path:
            if data.path.endswith(".npy"):
                try:
                    tokens = np.load(path, mmap_mode="r", allow_pickle=False).reshape(-1)
                except (ValueError, TypeError, OSError, EOFError):  # numpy's quote the header
                    raise ValueError(
                        f"data.path={data.path!r} is not a readable .npy file (its header or "
                        "size does not parse); save it with numpy.save"
                    ) from None
            else:  # a prepared file's header names its dtype (the worker never tokenizes it)
                dtype, header = token_dtype(data.path, data.dtype, access)
                tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
                if header is not None and header.documents:
                    with access.open(index_path(data.path), "data.path's index") as index:
                        ends = np.fromfile(index, np.uint64).astype(np.int64)
        _check_ids(tokens, vocab_size, data.path)
        return tokens, ends
    assert isinstance(data, TextData)
    jsonl = data.path.endswith(".jsonl")
    with access.open(data.path, "data.path") as path:
        if data.tokenizer == "byte":
            if not jsonl:
                with open(path, "rb") as f:
                    raw = np.frombuffer(f.read(), dtype=np.uint8)
                return raw, np.asarray([len(raw)])  # plain text: one document
            docs = documents(path, data.text_field, name=data.path)
            packed = b"".join(doc.encode() + b"\0" for doc in docs)
            tokens = np.frombuffer(packed, dtype=np.uint8)
            return tokens, np.flatnonzero(tokens == 0) + 1
        from tokenizers import Tokenizer  # only text jobs with a tokenizer.json need it

        with access.open(data.tokenizer, "data.tokenizer") as tok_path:
            try:
                tok = Tokenizer.from_file(tok_path)
            except Exception:  # tokenizers' parse errors quote the file ("unknown variant ...")
                raise ValueError(
                    f"data.tokenizer={data.tokenizer!r} is not a tokenizer.json the tokenizers "
                    "library can load; save it with tokenizer.save()"
                ) from None
        if not jsonl:
            with open(path, "rb") as f:
                try:
                    text = f.read().decode("utf-8")
                except UnicodeDecodeError as exc:  # its message quotes the byte: not shown
                    raise ValueError(
                        f"data.path={data.path!r} is not UTF-8 (at byte {exc.start}); save it "
                        'as UTF-8, or use tokenizer: "byte"'
                    ) from None
            ids = np.asarray(tok.encode(text).ids, dtype=np.int64)
            return ids, np.asarray([len(ids)])
        eos = end_of_text_id(tok)
        lengths, parts = [], []
        for doc in documents(path, data.text_field, name=data.path):
            parts.append([*tok.encode(doc).ids, eos])
            lengths.append(len(parts[-1]))
        return np.concatenate(parts).astype(np.int64), np.cumsum(lengths)


def _check_ids(tokens: np.ndarray, vocab_size: int, path: str) -> None:
    """Every id below vocab_size (the API read only the file's head): an embedding lookup
    past the vocabulary would fail deep in a step, or on a GPU corrupt memory."""
    for start in range(0, len(tokens), SCAN_TOKENS):
        block = tokens[start : start + SCAN_TOKENS]
        if int(block.max()) >= vocab_size:  # the id itself is the file's: not shown
            at = start + int(np.argmax(block >= vocab_size))
            raise ValueError(
                f"data.path={path!r} holds a token id at or above the model's vocab_size "
                f"{vocab_size} (the first at position {at}); use a model with a larger "
                "vocabulary or the tokenizer the file was made with"
            )


# ids checked per block: 256 MiB of uint32, bounded memory whatever the file's size
SCAN_TOKENS = 1 << 26


@dataclass
class TokenStream:
    tokens: np.ndarray  # (N,) token ids for training
    seq_len: int
    seed: int
    heldout: np.ndarray | None = None  # the data's tail, kept out of training
    global_batch: int = 1  # sequences a step trains on
    shuffle: bool = True
    doc_ends: np.ndarray | None = None  # (documents,) end offset of each, into `tokens`
    heldout_ends: np.ndarray | None = None  # the same into `heldout`
    _order: tuple[int, np.ndarray] | None = None  # (epoch, its permutation)

    @classmethod
    def open(
        cls,
        data: DataRef,
        vocab_size: int,
        seq_len: int,
        seed: int,
        heldout_fraction: float = 0.0,
        access: DataAccess | None = None,
        *,
        global_batch: int = 1,
        shuffle: bool = True,
    ) -> TokenStream:
        """The job's data; files are read through `access` (default: anywhere)."""
        tokens, ends = _load_tokens(data, vocab_size, seed, access or DataAccess.of(["/"], None))
        cut = len(tokens) - int(len(tokens) * heldout_fraction)
        train, heldout = tokens[:cut], (tokens[cut:] if heldout_fraction else None)
        for name, part in (("training", train), ("held-out", heldout)):
            if part is not None and len(part) < seq_len + 1:
                raise ValueError(
                    f"the {name} data holds {len(part)} tokens, fewer than one "
                    f"sequence of seq_len+1={seq_len + 1}; use more data, a "
                    "shorter seq_len or another eval.heldout_fraction"
                )
        held_ends = None if ends is None else np.append(ends[ends > cut] - cut, len(tokens) - cut)
        return cls(train, seq_len, seed, heldout, global_batch, shuffle, ends, held_ends)

    @property
    def sequences(self) -> int:
        """Sequences in one epoch: seq_len inputs each, plus the next one's first token."""
        return (len(self.tokens) - 1) // self.seq_len

    def epochs_done(self, steps: int) -> float:
        return steps * self.global_batch / self.sequences

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's sequence indices in the order it visits them."""
        if self._order is None or self._order[0] != epoch:
            n = self.sequences
            perm = (
                np.random.default_rng([self.seed, epoch]).permutation(n)
                if self.shuffle
                else np.arange(n)
            )
            self._order = (epoch, perm)  # one epoch's at a time: 8 bytes a sequence
        return self._order[1]

    def indices(self, position: int, count: int) -> np.ndarray:
        """The sequence indices at positions [position, position + count) of the run's
        order (epoch after epoch)."""
        n, out = self.sequences, []
        while count > 0:
            epoch, at = divmod(position, n)
            take = min(count, n - at)
            out.append(self.order(epoch)[at : at + take])
            position, count = position + take, count - take
        return np.concatenate(out)

    def _eval_starts(self, n: int) -> np.ndarray:
        assert self.heldout is not None, "no held-out split was asked for"
        return np.linspace(0, len(self.heldout) - self.seq_len - 1, n).astype(np.int64)

    def eval_batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same n held-out sequences at every evaluation, spread over the split."""
        return self._rows(self.heldout, self._eval_starts(n))  # type: ignore[arg-type]

    def eval_documents(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """eval_batch's sequences' positions and document indices (see `documents`)."""
        return _where(self._ends(self.heldout_ends), self._eval_starts(n), self.seq_len)

    def documents(
        self, step: int, round_idx: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each input token's position within its document and its document's index within
        its sequence, each (micro_batch, seq_len) int64, for the sequences `batch` gives."""
        position = step * self.global_batch + round_idx * micro_batch
        starts = self.indices(position, micro_batch) * self.seq_len
        return _where(self._ends(self.doc_ends), starts, self.seq_len)

    def _ends(self, ends: np.ndarray | None) -> np.ndarray:
        if ends is None:
            raise ValueError(
                "document_mask needs the data's document boundaries: a token file made by "
                "`wstrain prepare` (its .idx) or text/JSONL data"
            )
        return ends

    def batch(
        self, step: int, round_idx: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets of round `round_idx` of step `step`, each
        (micro_batch, seq_len) int64: the step's global_batch sequences, this round's run."""
        if (round_idx + 1) * micro_batch > self.global_batch:
            raise ValueError(
                f"round {round_idx} of {micro_batch} sequences runs past global_batch="
                f"{self.global_batch}; rounds x micro_batch must equal global_batch"
            )
        position = step * self.global_batch + round_idx * micro_batch
        return self._rows(self.tokens, self.indices(position, micro_batch) * self.seq_len)

    def target_tokens(self, step: int, sequences: int) -> int:
        """Every target of a token stream counts: each is the real next token (a document's
        end-of-text token predicts the next document's first token, as in torchtitan)."""
        return sequences * self.seq_len

    def _rows(self, tokens: np.ndarray, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.stack(
            [np.asarray(tokens[s : s + self.seq_len + 1], dtype=np.int64) for s in starts]
        )  # (B, S+1)
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def _where(ends: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions within documents and document indices within sequences, (B, S) each, of
    the sequences whose inputs start at token offsets `starts`."""
    t = starts[:, None] + np.arange(seq_len)  # (B, S) token offsets
    doc = np.searchsorted(ends, t, side="right")  # (B, S) global document index
    doc_start = np.where(doc > 0, ends[np.maximum(doc - 1, 0)], 0)
    begins = np.maximum(doc_start, starts[:, None])  # a document cut by the sequence's start
    return torch.from_numpy(t - begins), torch.from_numpy(doc - doc[:, :1])
