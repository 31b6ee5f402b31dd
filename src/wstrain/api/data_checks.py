"""The data checks of a submission (api/validation.py runs them): data.path's file opens
under the data roots, parses, holds a sequence and fits the model's vocabulary, with the
document index and held-out split that depend on it; data.tokenizer parses and fits the
model. Each failure is an InvalidSpec naming the field and the fix, never the file's bytes.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from wstrain.contracts.access import TOKENIZER_MAX_BYTES, DataAccess
from wstrain.contracts.documents import END_OF_TEXT_TOKENS, documents
from wstrain.contracts.errors import InvalidSpec
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import JobSpec, SyntheticData, TextData, TokenData
from wstrain.contracts.token_file import (
    RAW_TEXT_MAX_BYTES,
    TokenFileHeader,
    index_path,
    prepare_command,
    token_dtype,
)

_TOKEN_BYTES = {"uint16": 2, "uint32": 4}
# token ids checked on submit: 8 MiB of uint32 reads in ~2 ms; wrong-tokenizer files show in
# their first ids, and the worker checks the rest
HEAD_TOKENS = 1 << 21


def _check_tokens(
    data: TokenData, path: str, vocab_size: int | None, seq_len: int, access: DataAccess
) -> tuple[int, TokenFileHeader | None]:
    """dtype, length and the head's token ids of a .bin (raw or prepared) or .npy token file
    (`path`: the one data.path opened, /proc/self/fd/N); its length and its header (None
    for a bare file). The ids are held to `vocab_size` unless it is None (the model did
    not resolve: that failure is reported instead). Only the first HEAD_TOKENS ids are read
    here, so a submission costs the same for a 2 GiB file as for a small one; the worker
    checks every id before it trains (worker/io/data.py). Errors name positions and bounds,
    never ids or header values."""
    header = None
    if data.path.endswith(".npy"):
        try:
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, TypeError, OSError, EOFError):  # numpy's quote the header
            raise InvalidSpec(
                f"data.path={data.path!r} is not a readable .npy file (its header or size "
                "does not parse); save it with numpy.save"
            ) from None
        # a plain numeric dtype's name ("float32") is from a closed set; a structured one's
        # field names are the file's own text
        plain = tokens.dtype.names is None and tokens.dtype.kind in "biuf"
        if data.dtype is not None and tokens.dtype != np.dtype(data.dtype):
            raise InvalidSpec(
                f"data.path={data.path!r} holds "
                + (f"{tokens.dtype} tokens" if plain else "tokens of a non-numeric dtype")
                + f" but data.dtype={data.dtype!r}; set data.dtype to match (uint16 or "
                "uint32) or convert the file"
            )
        if not plain:
            raise InvalidSpec(
                f"data.path={data.path!r} holds tokens of a non-numeric dtype; save uint16 "
                "or uint32 token ids"
            )
        tokens = tokens.reshape(-1)
    else:
        try:
            dtype, header = token_dtype(data.path, data.dtype, access)
        except ValueError as exc:
            raise InvalidSpec(f"data.path: {exc}") from exc
        size, width = os.stat(path).st_size, _TOKEN_BYTES[dtype]
        if size % width or (header is not None and size != header.tokens * width):
            raise InvalidSpec(
                f"data.path={data.path!r} has {size} bytes, not "
                + (
                    f"a multiple of {width}"
                    if header is None
                    else f"{width} for each of the tokens as its header says; prepare it again"
                )
                + f"; is the dtype {dtype!r} right?"
            )
        if header is not None and vocab_size is not None and header.vocab_size > vocab_size:
            raise InvalidSpec(
                f"data.path={data.path!r} was made with a tokenizer larger than the model's "
                f"vocab_size {vocab_size} (its header says so); use a model with a larger "
                "vocabulary or prepare the data with its tokenizer"
            )
        if size < (seq_len + 1) * width:  # and numpy cannot map an empty file
            raise InvalidSpec(
                f"data.path={data.path!r} holds {size // width} tokens, fewer than "
                f"one sequence of seq_len+1={seq_len + 1}"
            )
        tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
    if len(tokens) < seq_len + 1:
        raise InvalidSpec(
            f"data.path={data.path!r} holds {len(tokens)} tokens, fewer than "
            f"one sequence of seq_len+1={seq_len + 1}"
        )
    head = tokens[:HEAD_TOKENS]
    if vocab_size is not None and int(head.max()) >= vocab_size:
        at = int(np.argmax(head >= vocab_size))
        raise InvalidSpec(
            f"data.path={data.path!r} holds a token id at or above the model's vocab_size "
            f"{vocab_size} (the first at position {at}); use a model with a larger "
            "vocabulary or the tokenizer the file was made with"
        )
    return len(tokens), header


def _check_index(data: TokenData, header: TokenFileHeader, access: DataAccess) -> None:
    """The document index beside a prepared token file matches its header: one uint64 end a
    document, the last one the token count (as `wstrain prepare` writes it). Two reads of
    8 bytes, whatever the index's size; the index's own values are never shown."""
    with access.descriptor(index_path(data.path), "data.path's index") as fd:
        size = os.fstat(fd).st_size
        last = os.pread(fd, 8, size - 8) if size >= 8 else b""
    if size != 8 * header.documents or int.from_bytes(last, sys.byteorder) != header.tokens:
        raise InvalidSpec(
            f"data.path={data.path!r}: its index (NAME.idx) does not match its header (one "
            "end offset a document, the last the token count); prepare the file again with "
            "`wstrain prepare`, or set document_mask: false"
        )


def _check_jsonl(data: TextData, path: str) -> None:
    """Every line a JSON object whose `text_field` is a string (`path`: data.path opened)."""
    try:
        for _ in documents(path, data.text_field, name=data.path):
            pass
    except ValueError as exc:
        raise InvalidSpec(f"data.path: {exc}; fix the line or set data.text_field") from exc


def _tokenizer_vocab(data: TextData, access: DataAccess) -> tuple[int, set[str]]:
    """The size and the special tokens of data.tokenizer (a tokenizers tokenizer.json), read
    whole under TOKENIZER_MAX_BYTES; errors name what is missing, never the file's text."""
    raw = access.read_bytes(
        data.tokenizer,
        "data.tokenizer",
        TOKENIZER_MAX_BYTES,
        fix='give the tokenizer.json the data was made with, or "byte"',
    )
    bad = f"data.tokenizer={data.tokenizer!r} is not a tokenizers tokenizer.json"
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:  # its msg is a fixed phrase, with no input in it
        raise InvalidSpec(f"{bad} ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError):  # not UTF-8, huge numbers, deep nesting
        raise InvalidSpec(f"{bad} (not UTF-8 JSON Python can read)") from None
    try:
        vocab = len(parsed["model"]["vocab"])
        specials = {t["content"] for t in parsed.get("added_tokens", [])}
    except (KeyError, TypeError, AttributeError):
        raise InvalidSpec(
            f"{bad} (it needs model.vocab and added_tokens[].content); save it with "
            "tokenizer.save()"
        ) from None
    return vocab, {t for t in specials if isinstance(t, str)}


def check_data_path(spec: JobSpec, dims: ModelDims | None, access: DataAccess) -> bool:
    """data.path: the file opens under the data roots, parses, holds a sequence and (with
    `dims`) fits the model's vocabulary; document_mask's index and eval's held-out split
    with it. True when it passed (InvalidSpec otherwise)."""
    data = spec.data
    if spec.document_mask and isinstance(data, SyntheticData):
        raise InvalidSpec(
            "document_mask: synthetic data has no documents; set it false", field="document_mask"
        )
    if isinstance(data, TokenData):
        vocab_size = None if dims is None else dims.vocab_size
        with access.open(data.path, "data.path") as path:  # by descriptor, checked
            count, header = _check_tokens(data, path, vocab_size, spec.seq_len, access)
        if spec.document_mask and (header is None or not header.documents):
            raise InvalidSpec(
                f"document_mask: data.path={data.path!r} has no document index (NAME.idx "
                "with its NAME.json header); make the file with `wstrain prepare`, or set "
                "document_mask: false",
                field="document_mask",
            )
        if spec.document_mask and header is not None:
            _check_index(data, header, access)
        held_out = int(count * spec.eval.heldout_fraction) if spec.eval else None
        if held_out is not None and held_out < spec.seq_len + 1:
            raise InvalidSpec(
                f"eval.heldout_fraction={spec.eval.heldout_fraction} of "  # type: ignore[union-attr]
                f"{count} tokens leaves {held_out}, fewer than one sequence of "
                f"seq_len+1={spec.seq_len + 1}; raise the fraction or use more data",
                field="eval.heldout_fraction",
            )
    if isinstance(data, TextData):
        with access.open(data.path, "data.path") as path:  # by descriptor, checked
            size = os.stat(path).st_size
            if size > RAW_TEXT_MAX_BYTES:
                command = prepare_command(data.path, data.tokenizer, data.text_field)
                raise InvalidSpec(
                    f"data.path={data.path!r} is {size / 2**20:.0f} MiB of raw text, over the "
                    f"{RAW_TEXT_MAX_BYTES >> 20} MiB a job tokenizes at its start; make a "
                    f"token file once, on all cores: `{command}`, and submit data: "
                    "{kind: tokens, path: ...bin}"
                )
            if data.path.endswith(".jsonl"):
                _check_jsonl(data, path)
    return True


def check_tokenizer(data: TextData, dims: ModelDims | None, access: DataAccess) -> None:
    """data.tokenizer: it parses, has the end-of-text token JSONL packing needs and (with
    `dims`) no more tokens than the model's vocabulary. Independent of data.path's file."""
    vocab, specials = 256, set[str]()
    if data.tokenizer != "byte":
        vocab, specials = _tokenizer_vocab(data, access)
        if data.path.endswith(".jsonl") and not specials & set(END_OF_TEXT_TOKENS):
            raise InvalidSpec(
                f"data.tokenizer={data.tokenizer!r} has none of the "
                f"end-of-text tokens {list(END_OF_TEXT_TOKENS)} that packing "
                "JSONL documents needs; add one to the tokenizer"
            )
    if dims is not None and vocab > dims.vocab_size:
        raise InvalidSpec(
            f"the tokenizer has {vocab} tokens but the model's vocab_size is "
            f"{dims.vocab_size}; use a model with vocab_size >= {vocab}"
        )
