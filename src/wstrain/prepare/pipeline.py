"""`wstrain prepare`: text, JSONL, Parquet or a `datasets` directory into a token file
(contracts/token_file.py), streaming, on all cores, resumable.

    wstrain prepare /data/web.jsonl /data/web.bin --tokenizer /models/llama/tokenizer.json
    header = prepare(PrepareRequest("/data/web.jsonl", "/data/web.bin", "tok.json"))

The input is cut into chunks (sources.py); a pool of one thread per core tokenizes a chunk
at a time each into a part file under `web.parts/` (encode.py says why threads); at most two
chunks a thread are queued, and the text encoded at once is bounded, so memory does not grow
with the input. When every part is there they are concatenated in chunk order into web.bin
and web.idx and the header is marked complete. Killed at any point, the same command
resumes: the header written first records the request, parts that exist are whole (renamed
into place) and are kept.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wstrain.contracts.token_file import (
    TokenFileHeader,
    header_path,
    index_path,
    read_header,
)
from wstrain.prepare.encode import Encoder, TokenizerInfo
from wstrain.prepare.sources import Chunk, Source, open_source

log = logging.getLogger(__name__)

# A chunk: 16 MiB of text is ~4 M tokens, ~2 s of one core; small enough that an
# interrupted run loses little and the tail of the run keeps every core busy.
DEFAULT_CHUNK_BYTES = 16 << 20
COPY_BYTES = 64 << 20  # concatenation buffer


@dataclass(frozen=True)
class PrepareRequest:
    source: str
    out: str  # the .bin to write; .idx, .json and .parts/ go beside it
    tokenizer: str = "byte"
    text_field: str = "text"
    workers: int = 0  # threads; 0: one per core this process may use
    chunk_bytes: int = DEFAULT_CHUNK_BYTES


def _workers(asked: int) -> int:
    return asked or len(os.sched_getaffinity(0))


# glibc gives each thread its own malloc arena (up to 8 a core), and an arena keeps what its
# thread freed: 16 tokenizing threads peaked at 1.3 GiB RSS on the H100 host. Four arenas
# shared by all threads, trimmed after each chunk, keep less (measured on 2 cores only so
# far: bench/RESULTS.md).
MALLOC_ARENAS = 4
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def _libc() -> object | None:
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None  # not glibc: nothing to tune


def _fresh_header(req: PrepareRequest, source: Source, info: TokenizerInfo) -> TokenFileHeader:
    return TokenFileHeader(
        complete=False,
        dtype=info.dtype,  # type: ignore[arg-type]
        tokens=0,
        documents=0,
        vocab_size=info.vocab_size,
        eos_id=info.eos_id,
        tokenizer=info.name,
        tokenizer_sha256=info.sha256,
        source=str(Path(req.source).resolve()),
        source_bytes=source.size_bytes(),
        text_field=req.text_field,
        chunk_bytes=req.chunk_bytes,
    )


def _write_header(out: Path, header: TokenFileHeader) -> None:
    tmp = header_path(out).with_suffix(".json.tmp")
    tmp.write_text(header.model_dump_json(indent=2) + "\n")
    os.replace(tmp, header_path(out))


def prepare(req: PrepareRequest, progress: bool = False) -> TokenFileHeader:
    """Write req.out (+ .idx, .json); resume a run of the same request that was cut off."""
    out = Path(req.out)
    if out.suffix != ".bin":
        raise ValueError(f"out={req.out!r}: name the token file NAME.bin")
    source = open_source(req.source, req.text_field)
    encoder = Encoder.open(req.tokenizer)
    info = encoder.info
    want = _fresh_header(req, source, info)
    parts = out.with_suffix(".parts")
    have = read_header(out) if header_path(out).is_file() else None
    same = (
        have is not None
        and have.model_copy(update={"complete": False, "tokens": 0, "documents": 0}) == want
    )
    if same and have is not None and have.complete and out.is_file():
        log.info("%s is already prepared from %s: %d tokens", out, req.source, have.tokens)
        return have
    if not same and parts.exists():
        log.info("%s: another request made %s; starting over", out, parts)
        shutil.rmtree(parts)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts.mkdir(exist_ok=True)
    _write_header(out, want)

    chunks = source.chunks(req.chunk_bytes)
    done = {c.index: encoder.part_done(parts, c) for c in chunks}
    todo = [c for c in chunks if done[c.index] is None]
    if len(todo) < len(chunks):
        log.info("resuming: %d of %d chunks already done", len(chunks) - len(todo), len(chunks))
    total_bytes = sum(c.size_bytes for c in chunks)
    done_bytes = total_bytes - sum(c.size_bytes for c in todo)
    _run(encoder, source, todo, parts, _workers(req.workers), progress, (done_bytes, total_bytes))
    header = _concatenate(out, parts, chunks, info, want)
    shutil.rmtree(parts)
    return header


def _run(
    encoder: Encoder,
    source: Source,
    todo: list[Chunk],
    parts: Path,
    workers: int,
    progress: bool,
    bytes_done_total: tuple[int, int],
) -> None:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    libc = _libc()
    if libc is not None:  # before the pool's threads make arenas of their own
        libc.mallopt(_M_ARENA_MAX, MALLOC_ARENAS)  # type: ignore[attr-defined]
    with Progress(*columns, disable=not progress) as bar, ThreadPoolExecutor(workers) as pool:
        done_bytes, total_bytes = bytes_done_total
        task = bar.add_task("tokenizing", total=total_bytes, completed=done_bytes)
        pending: dict[Future[tuple[int, int]], Chunk] = {}
        queue = list(reversed(todo))
        try:
            while queue or pending:
                while queue and len(pending) < 2 * workers:
                    chunk = queue.pop()
                    pending[pool.submit(encoder.chunk, source, chunk, parts)] = chunk
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    chunk = pending.pop(future)
                    future.result()  # a chunk's error (a bad JSON line) stops the run, named
                    bar.advance(task, chunk.size_bytes)
                    if libc is not None:
                        libc.malloc_trim(0)  # type: ignore[attr-defined]
        except BaseException:
            pool.shutdown(cancel_futures=True)  # the chunks not started yet: never
            raise


def _concatenate(
    out: Path, parts: Path, chunks: list[Chunk], info: TokenizerInfo, want: TokenFileHeader
) -> TokenFileHeader:
    """parts/*.bin in chunk order into out, their document ends (shifted) into out.idx."""
    tokens, documents = 0, 0
    tmp_bin, tmp_idx = out.with_suffix(".bin.tmp"), out.with_suffix(".idx.tmp")
    itemsize = np.dtype(info.dtype).itemsize
    with open(tmp_bin, "wb") as dst, open(tmp_idx, "wb") as idx:
        for chunk in chunks:
            stem = parts / f"{chunk.index:06d}"
            with open(stem.with_suffix(".bin"), "rb") as src:
                shutil.copyfileobj(src, dst, COPY_BYTES)
            ends = np.fromfile(stem.with_suffix(".ends"), np.uint64)
            (ends + np.uint64(tokens)).tofile(idx)
            tokens += stem.with_suffix(".bin").stat().st_size // itemsize
            documents += len(ends)
    os.replace(tmp_idx, index_path(out))
    os.replace(tmp_bin, out)
    header = want.model_copy(update={"complete": True, "tokens": tokens, "documents": documents})
    _write_header(out, header)
    log.info("%s: %d tokens, %d documents (%s)", out, tokens, documents, info.dtype)
    return header
