"""Tokenizing one chunk into one part file, in a worker process of `wstrain prepare`.

    info = tokenizer_info("tokenizer.json")          # vocab, eos id, dtype, hash (parent)
    init_worker("tokenizer.json")                    # once per worker process
    tokens, docs = encode_chunk(source, chunk, parts_dir, info)

A part is two files written under temporary names and renamed into place, so a part that
exists is whole: `NNNNNN.bin` (the chunk's ids) and `NNNNNN.ends` (uint64 ends of the
documents that end in the chunk, relative to the part). Each worker tokenizes on one thread
(TOKENIZERS_PARALLELISM=false): the parallelism is the processes, one per core, which also
spreads the JSON parsing and id copying that a single encode_batch caller does on one core.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from wstrain.prepare.sources import Chunk, Source
from wstrain.scheduler.contracts.jobs import END_OF_TEXT_TOKENS

# Text per encode call: large enough that the call overhead vanishes (~1 ms), small enough
# that its Encoding objects (~100 bytes per token) stay near 100 MB.
BATCH_TEXT_BYTES = 1 << 20
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


def tokenizer_info(name: str) -> TokenizerInfo:
    if name == "byte":
        return TokenizerInfo("byte", "", BYTE_VOCAB, BYTE_EOS)
    from tokenizers import Tokenizer

    raw = Path(name).read_bytes()
    tok = Tokenizer.from_str(raw.decode("utf-8"))
    for token in END_OF_TEXT_TOKENS:
        eos = tok.token_to_id(token)
        if eos is not None:
            break
    else:
        raise ValueError(
            f"the tokenizer {name} has none of the end-of-text tokens {END_OF_TEXT_TOKENS} "
            "that separate packed documents; add one to it"
        )
    return TokenizerInfo(
        str(Path(name).resolve()),
        hashlib.sha256(raw).hexdigest(),
        tok.get_vocab_size(with_added_tokens=True),
        eos,
    )


_tokenizer: Any = None  # this worker process's tokenizer (None: byte)


def init_worker(name: str) -> None:
    global _tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process, see above
    if name != "byte":
        from tokenizers import Tokenizer

        _tokenizer = Tokenizer.from_file(name)


def _encode(texts: list[str]) -> list[list[int]]:
    if _tokenizer is None:
        return [list(t.encode("utf-8")) for t in texts]
    # encode_batch_fast skips the character offsets nobody here reads (tokenizers >= 0.20)
    encode = getattr(_tokenizer, "encode_batch_fast", _tokenizer.encode_batch)
    return [e.ids for e in encode(texts)]


def _batches(texts: Any) -> Any:
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= BATCH_TEXT_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_chunk(source: Source, chunk: Chunk, parts: Path, info: TokenizerInfo) -> tuple[int, int]:
    """Tokenize `chunk` of `source` into parts/NNNNNN.{bin,ends}; (tokens, documents)."""
    whole_docs = source.ends_documents()
    dtype = np.dtype(info.dtype)
    stem = parts / f"{chunk.index:06d}"
    tmp_bin, tmp_ends = stem.with_suffix(".bin.tmp"), stem.with_suffix(".ends.tmp")
    ends: list[int] = []
    written = 0
    with open(tmp_bin, "wb") as out:
        for batch in _batches(source.read(chunk)):
            encoded = _encode(batch)
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


def part_done(parts: Path, chunk: Chunk, info: TokenizerInfo) -> tuple[int, int] | None:
    """(tokens, documents) of a part already written, None if it is not."""
    stem = parts / f"{chunk.index:06d}"
    bin_path, ends_path = stem.with_suffix(".bin"), stem.with_suffix(".ends")
    if not bin_path.is_file() or not ends_path.is_file():
        return None
    return bin_path.stat().st_size // np.dtype(info.dtype).itemsize, ends_path.stat().st_size // 8
