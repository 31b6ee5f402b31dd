"""Tokenizing one chunk into one part file, on a thread of `wstrain prepare`'s pool.

    encoder = Encoder.open("tokenizer.json")          # or "byte"; one per run
    tokens, docs = encoder.chunk(source, chunk, parts_dir)   # from any number of threads

One thread per core shares one interpreter and one tokenizer: tokenizers releases the GIL
while it encodes, and each call runs on its caller's thread (TOKENIZERS_PARALLELISM=false),
so the pool's threads tokenize in parallel while the Python work between calls (JSON
parsing, copying ids) interleaves with them. Threads rather than processes: a process per
core costs an interpreter, numpy and the tokenizer each (16 processes: 2.9 GiB RSS against
1.6 GiB for 16 threads on the H100 host, bench/RESULTS.md). The text being encoded at once is
bounded (IN_FLIGHT_TEXT_BYTES), so a run of huge documents cannot add up across threads.

A part is two files written under temporary names and renamed into place, so a part that
exists is whole: `NNNNNN.bin` (the chunk's ids) and `NNNNNN.ends` (uint64 ends of the
documents that end in the chunk, relative to the part).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from wstrain.contracts.documents import end_of_text_id
from wstrain.prepare.sources import Chunk, Source

# Text per encode call: the call's overhead (~1 ms) vanishes, and its Encoding objects and id
# lists (~100 bytes a token) stay near 10 MB a thread.
BATCH_TEXT_BYTES = 256 << 10
# Text being encoded at once over all threads: 16 threads' batches fit; a 1 MiB document
# (whose encoding peaks near 90 MB) waits while others of its size are in flight.
IN_FLIGHT_TEXT_BYTES = 4 << 20
BYTE_VOCAB = 256
BYTE_EOS = 0  # the byte tokenizer ends documents with NUL, as the worker's text path does


@dataclass(frozen=True)
class TokenizerInfo:
    name: str  # "byte" or the tokenizer.json path
    sha256: str
    vocab_size: int
    eos_id: int

    @property
    def dtype(self) -> str:
        return "uint16" if self.vocab_size <= 1 << 16 else "uint32"


def _batches(texts: Iterable[str]) -> Iterator[tuple[list[str], int]]:
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= BATCH_TEXT_BYTES:
            yield batch, size
            batch, size = [], 0
    if batch:
        yield batch, size


class Encoder:
    def __init__(self, info: TokenizerInfo, tokenizer: Any) -> None:
        self.info, self._tok = info, tokenizer
        self._in_flight = threading.Condition()
        self._used = 0  # text bytes being encoded now, over all threads

    @classmethod
    def open(cls, name: str) -> Encoder:
        """ "byte", or a tokenizers tokenizer.json with an end-of-text token."""
        if name == "byte":
            return cls(TokenizerInfo("byte", "", BYTE_VOCAB, BYTE_EOS), None)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # each call on its caller's thread
        from tokenizers import Tokenizer

        raw = Path(name).read_bytes()
        try:
            tok = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception for a bad file
            raise ValueError(f"{name} is not a tokenizers tokenizer.json: {exc}") from exc
        eos = end_of_text_id(tok)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        info = TokenizerInfo(str(Path(name).resolve()), hashlib.sha256(raw).hexdigest(), vocab, eos)
        return cls(info, tok)

    def _encode(self, texts: list[str], size: int) -> list[list[int]]:
        with self._in_flight:  # alone, any size goes; beside others, within the bound
            self._in_flight.wait_for(
                lambda: not self._used or self._used + size <= IN_FLIGHT_TEXT_BYTES
            )
            self._used += size
        try:
            if self._tok is None:
                return [list(t.encode("utf-8")) for t in texts]
            # encode_batch_fast skips the character offsets nobody here reads (>= 0.20)
            encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
            return [e.ids for e in encode(texts)]
        finally:
            with self._in_flight:
                self._used -= size
                self._in_flight.notify_all()

    def chunk(self, source: Source, chunk: Chunk, parts: Path) -> tuple[int, int]:
        """Tokenize `chunk` of `source` into parts/NNNNNN.{bin,ends}; (tokens, documents)."""
        info, whole_docs = self.info, source.ends_documents()
        dtype = np.dtype(info.dtype)
        stem = parts / f"{chunk.index:06d}"
        tmp_bin, tmp_ends = stem.with_suffix(".bin.tmp"), stem.with_suffix(".ends.tmp")
        ends: list[int] = []
        written = 0
        with open(tmp_bin, "wb") as out:
            for batch, size in _batches(source.read(chunk)):
                encoded = self._encode(batch, size)
                if whole_docs:
                    for ids in encoded:
                        ids.append(info.eos_id)
                    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
                    ends.extend((written + np.cumsum(lengths)).tolist())
                count = sum(map(len, encoded))
                np.fromiter(chain.from_iterable(encoded), dtype, count).tofile(out)
                written += count
            if chunk.last and not whole_docs:  # a plain-text source is one document
                np.asarray([info.eos_id], dtype).tofile(out)
                written += 1
                ends.append(written)
        np.asarray(ends, np.uint64).tofile(tmp_ends)
        os.replace(tmp_ends, stem.with_suffix(".ends"))
        os.replace(tmp_bin, stem.with_suffix(".bin"))  # last: a .bin that exists is whole
        return written, len(ends)

    def part_done(self, parts: Path, chunk: Chunk) -> tuple[int, int] | None:
        """(tokens, documents) of a part already written, None if it is not."""
        stem = parts / f"{chunk.index:06d}"
        bin_path, ends_path = stem.with_suffix(".bin"), stem.with_suffix(".ends")
        if not bin_path.is_file() or not ends_path.is_file():
            return None
        itemsize = np.dtype(self.info.dtype).itemsize
        return bin_path.stat().st_size // itemsize, ends_path.stat().st_size // 8
