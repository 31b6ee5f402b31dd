"""The token file `wstrain prepare` writes and a job's `data: {kind: tokens}` reads: three
files beside each other, named by one stem.

    train.bin    the token ids, uint16 (vocabularies up to 65,536) or uint32, native order
    train.idx    document ends: uint64 token offsets, one per document (the last = tokens)
    train.json   this header: dtype, counts, the tokenizer and its SHA-256, the source

A header whose `complete` is false is a preparation still running or interrupted: the API
refuses it and `wstrain prepare` with the same arguments resumes it. A bare .bin or .npy
without a header is still accepted (dtype from the job spec, no document index).

Also here: the largest raw text a job may name (above it the worker would tokenize many
minutes at job start, in one process's memory; the API asks for `wstrain prepare` instead).
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from wstrain.contracts.access import TOKEN_HEADER_MAX_BYTES, DataAccess, file_problems

# Raw text or JSONL a job may name directly: 64 MiB tokenizes in ~10 s on one core with a
# BPE tokenizer; larger inputs go through `wstrain prepare`, once, on all cores.
RAW_TEXT_MAX_BYTES = 64 << 20
# Documents document_span reads from the front of an index: 8 MiB, about a second of Python
SPAN_SAMPLE_DOCUMENTS = 1 << 20


class TokenFileHeader(BaseModel):
    """train.json: what the token file holds and how it was made."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["wstrain.tokens"] = "wstrain.tokens"
    version: Literal[1] = 1
    complete: bool = Field(description="false while `wstrain prepare` runs or if it was cut off")
    dtype: Literal["uint16", "uint32"]
    tokens: int = Field(ge=0, description="token ids in the .bin")
    documents: int = Field(ge=0, description="entries of the .idx")
    vocab_size: int = Field(gt=0, description="the tokenizer's vocabulary, ids below it")
    eos_id: int = Field(ge=0, description="the end-of-text id appended to every document")
    tokenizer: str = Field(description='"byte" or the tokenizer.json path it was made with')
    tokenizer_sha256: str = Field(description='hash of the tokenizer.json ("" for byte)')
    source: str = Field(description="the input: a text, JSONL or Parquet file, or an Arrow dir")
    source_bytes: int = Field(ge=0)
    text_field: str = Field(description="the JSONL key or Parquet/Arrow column read")
    chunk_bytes: int = Field(gt=0, description="the unit of work and of resumption")


def header_path(bin_path: str | Path) -> Path:
    """train.bin -> train.json (the header beside a token file)."""
    return Path(bin_path).with_suffix(".json")


def index_path(bin_path: str | Path) -> Path:
    """train.bin -> train.idx (the document ends beside a token file)."""
    return Path(bin_path).with_suffix(".idx")


def _anywhere() -> DataAccess:
    return DataAccess.of(["/"], None)  # callers that name no roots: `wstrain prepare`, tests


def read_header(bin_path: str | Path, access: DataAccess | None = None) -> TokenFileHeader | None:
    """The header beside `bin_path`, None if there is none (a bare token file), read through
    `access` (by descriptor, checked, at most TOKEN_HEADER_MAX_BYTES). ValueError names the
    file and the fields at fault, never its values, if it is there but unreadable."""
    path = header_path(bin_path)
    if Path(bin_path).suffix != ".bin" or not os.path.lexists(path):
        return None
    raw = (access or _anywhere()).read_bytes(
        path,
        "data.path's header",
        TOKEN_HEADER_MAX_BYTES,
        fix="a token file's header is ~0.5 KB; run `wstrain prepare` again to rewrite it",
    )
    try:
        return TokenFileHeader.model_validate_json(raw)
    except ValidationError as exc:
        raise ValueError(
            f"{path} is not a wstrain token-file header ({file_problems(exc, 3)}); run "
            "`wstrain prepare` again to rewrite it"
        ) from None


def document_span(
    bin_path: str | Path,
    seq_len: int,
    documents: int = SPAN_SAMPLE_DOCUMENTS,
    access: DataAccess | None = None,
) -> int:
    """The tokens a query's document holds within its sequence, token-weighted: over the
    index's documents cut where sequences start (every seq_len tokens, as the data stream
    cuts them), the sum of squared lengths over the tokens. A long sequence's attention
    within documents costs this span a query instead of the sequence's (the planner's
    NodeProfile.document_span). 0 without an index. Reads the first `documents`, through
    `access` (by descriptor, checked)."""
    path = index_path(bin_path)
    if not os.path.lexists(path):
        return 0
    with (access or _anywhere()).descriptor(path, "data.path's index") as fd:
        raw = os.pread(fd, 8 * documents, 0)
    ends = array("Q")
    ends.frombytes(raw[: len(raw) // 8 * 8])  # uint64, native order as prepare writes it
    squares = start = 0
    for end in ends:  # the document's parts in each sequence it meets, in O(1) a document:
        if end > start:  # an index of nonsense ends (2^63) costs no more than a real one
            first = min(end, (start // seq_len + 1) * seq_len)  # up to the next sequence
            whole, last = divmod(end - first, seq_len)  # whole sequences, then the rest
            squares += (first - start) ** 2 + whole * seq_len**2 + last**2
        start = max(start, end)
    return round(squares / start) if start else 0


def prepare_command(path: str, tokenizer: str, text_field: str) -> str:
    """The `wstrain prepare` line that turns a raw input into a token file."""
    stem = str(Path(path).with_suffix(""))
    extra = f" --text-field {text_field}" if text_field != "text" else ""
    return f"wstrain prepare {path} {stem}.bin --tokenizer {tokenizer}{extra}"


def token_dtype(
    bin_path: str | Path, dtype: str | None, access: DataAccess | None = None
) -> tuple[str, TokenFileHeader | None]:
    """The ids' width of a job's token file and its header: the header's for a prepared
    file (a complete one: an interrupted preparation is refused), else `dtype` or uint32.
    ValueError says what is wrong and the fix; the header is read through `access`."""
    header = read_header(bin_path, access)
    if header is None:
        return dtype or "uint32", None
    if not header.complete:
        raise ValueError(
            f"{bin_path} is still being prepared or its preparation was cut off "
            f"({header_path(bin_path)} says complete: false); run the same `wstrain prepare` "
            "again to finish it"
        )
    if dtype is not None and dtype != header.dtype:
        raise ValueError(
            f"data.dtype={dtype!r} but {header_path(bin_path)} says the file holds "
            f"{header.dtype} ids; leave data.dtype out"
        )
    return header.dtype, header
