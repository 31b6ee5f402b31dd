"""The inputs `wstrain prepare` reads, each cut into chunks of about `chunk_bytes` that
worker processes tokenize independently (the unit of parallel work and of resumption).

    source = open_source("/data/web.jsonl", "text")
    chunks = source.chunks(16 << 20)
    for doc in source.read(chunks[3]): ...     # in any process: sources and chunks pickle

- `.jsonl` (or `.json` lines): one document per line under `text_field`; a chunk is a byte
  range, and a line belongs to the chunk its first byte lies in, so no line is read twice or
  lost however the ranges fall;
- any other file: plain UTF-8 text, one document, cut at line ends into chunks;
- `.parquet`: the `text_field` column, a chunk per row group (needs pyarrow:
  `pip install 'wstrain[parquet]'`);
- a directory saved by Hugging Face `datasets` (`save_to_disk`): the `text_field` column, a
  chunk per run of rows (needs `pip install 'wstrain[datasets]'`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Chunk:
    index: int
    start: int  # byte offset, row group or first row
    stop: int  # end byte offset (exclusive) or row (exclusive)
    size_bytes: int  # for progress
    last: bool  # the source's final chunk (a plain-text file's document ends in it)


class Source(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def field(self) -> str: ...

    def size_bytes(self) -> int: ...

    def chunks(self, chunk_bytes: int) -> list[Chunk]: ...

    def read(self, chunk: Chunk) -> Iterator[str]:
        """The chunk's documents' text; a plain-text chunk yields its lines as one piece."""
        ...

    def ends_documents(self) -> bool:
        """Each item `read` yields is a whole document (else: the whole source is one)."""
        ...


def _byte_ranges(size: int, chunk_bytes: int) -> list[Chunk]:
    starts = list(range(0, max(size, 1), chunk_bytes))
    return [
        Chunk(i, s, min(s + chunk_bytes, size), min(chunk_bytes, size - s), i == len(starts) - 1)
        for i, s in enumerate(starts)
    ]


def _lines(path: str, chunk: Chunk) -> Iterator[tuple[int, bytes]]:
    """(line number within the chunk, line) for the lines that start in [start, stop)."""
    with open(path, "rb") as f:
        if chunk.start > 0:
            f.seek(chunk.start - 1)
            f.readline()  # the line in progress at `start` belongs to the previous chunk
        at, number = f.tell(), 0
        while at < chunk.stop:
            line = f.readline()
            if not line:
                return
            number += 1
            yield number, line
            at += len(line)


@dataclass(frozen=True)
class _FileSource:
    """A file read in byte ranges that start and end at line starts (see `_lines`)."""

    path: str
    field: str = "text"

    def size_bytes(self) -> int:
        return Path(self.path).stat().st_size

    def chunks(self, chunk_bytes: int) -> list[Chunk]:
        return _byte_ranges(self.size_bytes(), chunk_bytes)


@dataclass(frozen=True)
class JsonlSource(_FileSource):
    def ends_documents(self) -> bool:
        return True

    def read(self, chunk: Chunk) -> Iterator[str]:
        for number, line in _lines(self.path, chunk):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)[self.field]
            except (ValueError, KeyError, TypeError):
                doc = None
            if not isinstance(doc, str):
                raise ValueError(
                    f"{self.path}: line {number} after byte {chunk.start} is not a JSON "
                    f"object with a {self.field!r} string; fix it or pass --text-field"
                )
            yield doc


@dataclass(frozen=True)
class TextSource(_FileSource):
    def ends_documents(self) -> bool:
        return False

    def read(self, chunk: Chunk) -> Iterator[str]:
        text = b"".join(line for _, line in _lines(self.path, chunk))
        if text:
            yield text.decode("utf-8")


def _optional(module: str, extra: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as exc:
        raise ValueError(
            f"reading this input needs {module.split('.')[0]}: pip install 'wstrain[{extra}]'"
        ) from exc


@dataclass(frozen=True)
class ParquetSource:
    path: str
    field: str

    def _file(self) -> Any:
        return _optional("pyarrow.parquet", "parquet").ParquetFile(self.path)

    def size_bytes(self) -> int:
        meta = self._file().metadata
        return sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))

    def chunks(self, chunk_bytes: int) -> list[Chunk]:
        pf = self._file()
        if self.field not in pf.schema_arrow.names:
            raise ValueError(
                f"{self.path} has no column {self.field!r} (it has {pf.schema_arrow.names}); "
                "pass --text-field"
            )
        groups = pf.metadata.num_row_groups
        return [
            Chunk(g, g, g + 1, pf.metadata.row_group(g).total_byte_size, g == groups - 1)
            for g in range(groups)
        ]

    def ends_documents(self) -> bool:
        return True

    def read(self, chunk: Chunk) -> Iterator[str]:
        table = self._file().read_row_group(chunk.start, columns=[self.field])
        yield from _strings(table.column(self.field).to_pylist(), self.path, self.field)


@dataclass(frozen=True)
class ArrowDirSource:
    path: str
    field: str

    def _dataset(self) -> Any:
        ds = _optional("datasets", "datasets").load_from_disk(self.path)
        if not hasattr(ds, "column_names") or isinstance(ds.column_names, dict):
            raise ValueError(
                f"{self.path} is a DatasetDict with splits {list(ds)}; give one split's "
                f"directory (e.g. {self.path}/train)"
            )
        if self.field not in ds.column_names:
            raise ValueError(
                f"{self.path} has no column {self.field!r} (it has {ds.column_names}); "
                "pass --text-field"
            )
        return ds

    def size_bytes(self) -> int:
        return int(self._dataset().data.nbytes)

    def chunks(self, chunk_bytes: int) -> list[Chunk]:
        ds = self._dataset()
        rows = len(ds)
        per_row = max(1, int(ds.data.nbytes) // max(rows, 1))
        step = max(1, chunk_bytes // per_row)
        starts = list(range(0, rows, step))
        return [
            Chunk(
                i, s, min(s + step, rows), (min(s + step, rows) - s) * per_row, i == len(starts) - 1
            )
            for i, s in enumerate(starts)
        ]

    def ends_documents(self) -> bool:
        return True

    def read(self, chunk: Chunk) -> Iterator[str]:
        rows = self._dataset()[chunk.start : chunk.stop][self.field]
        yield from _strings(rows, self.path, self.field)


def _strings(values: list[Any], path: str, field: str) -> Iterator[str]:
    for v in values:
        if not isinstance(v, str):
            raise ValueError(f"{path}: column {field!r} holds {type(v).__name__}, not text")
        yield v


def open_source(path: str, field: str) -> Source:
    """The reader for `path`, by its kind (see the module docstring)."""
    p = Path(path)
    if p.is_dir():
        return ArrowDirSource(path, field)
    if not p.is_file():
        raise ValueError(f"{path} does not exist")
    if p.suffix == ".parquet":
        return ParquetSource(path, field)
    if p.suffix in (".jsonl", ".json"):
        return JsonlSource(path, field)
    return TextSource(path, field)
