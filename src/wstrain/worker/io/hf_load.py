"""Fine-tuning from a Hugging Face model directory: its `*.safetensors` (sharded or not) are
read one tensor at a time straight into the training state's own storage — the host tiles of
the working set or the resident model's parameters — so loading never holds a second copy.

The files are read with plain `readinto` calls into each destination tensor's bytes (or, when
the file's dtype differs, through one 64 MiB conversion buffer), not through the
`safetensors` library's memory map: mapped shard pages count in the process's RSS while a
shard is open, which put a whole shard (up to 5 GB in transformers' default) on top of the
training state (measured: bench/load_rss.py). The format is the safetensors spec's: an
8-byte little-endian header length, a JSON header of {name: {dtype, shape, data_offsets}},
then the raw little-endian data.

    stream_into(host.weight_views(), Path(spec.model.path))   # or HostState.stream_from
"""

from __future__ import annotations

import io
import json
import logging
import struct
from contextlib import nullcontext
from pathlib import Path
from typing import Any, BinaryIO

import torch

from wstrain.contracts.access import SAFETENSORS_HEADER_MAX_BYTES, DataAccess

log = logging.getLogger(__name__)

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}
CONVERT_BYTES = 64 * 1024**2  # conversion buffer when the file's dtype is not the state's


def read_header(f: BinaryIO | io.RawIOBase) -> tuple[dict[str, dict[str, Any]], int]:
    """(tensor entries by name, byte offset of the data section) of a safetensors file; a
    header over SAFETENSORS_HEADER_MAX_BYTES or not a safetensors header is a ValueError
    that says so without quoting it."""
    name = getattr(f, "name", "a .safetensors file")
    raw = f.read(8)
    (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (-1,)
    if not 0 < length <= SAFETENSORS_HEADER_MAX_BYTES:  # never allocate what a file claims
        raise ValueError(
            f"{name}: its header length is not between 1 and {SAFETENSORS_HEADER_MAX_BYTES} "
            "bytes; is it a .safetensors file? save the model with save_pretrained"
        )
    try:
        header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        for entry in header.values():
            _ = (entry["dtype"], tuple(entry["shape"]), *entry["data_offsets"])
    except (ValueError, RecursionError, TypeError, KeyError, AttributeError):
        raise ValueError(  # json's and Python's messages would quote the header: not shown
            f"{name}: its header is not a safetensors header (JSON of dtype, shape and "
            "data_offsets by tensor); save the model with save_pretrained"
        ) from None
    return header, 8 + length


def _read_into(f: io.RawIOBase, dest: torch.Tensor, dtype: torch.dtype, nbytes: int) -> None:
    flat = dest.view(-1)  # views into tiles and parameters are contiguous
    if dtype == dest.dtype:
        view = memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]  # ndarray is a buffer
        if f.readinto(view) != nbytes:
            raise ValueError(f"{getattr(f, 'name', f)}: truncated tensor data")
        return
    itemsize = torch.empty((), dtype=dtype).element_size()
    step = max(1, CONVERT_BYTES // itemsize)
    buf = torch.empty(min(step, flat.numel()), dtype=dtype)
    for start in range(0, flat.numel(), step):
        part = buf[: min(step, flat.numel() - start)]
        chunk = memoryview(part.view(torch.uint8).numpy())  # type: ignore[arg-type]  # a buffer
        if f.readinto(chunk) != part.nbytes:
            raise ValueError(f"{getattr(f, 'name', f)}: truncated tensor data")
        flat[start : start + part.numel()].copy_(part)


def stream_into(
    views: dict[str, torch.Tensor], directory: Path, access: DataAccess | None = None
) -> int:
    """Copy every tensor of the directory's safetensors files into `views` (Hugging Face
    names); returns the bytes read. ValueError names missing, unexpected or misshapen ones.
    With `access` (a user's model dir, not our own checkpoint) each file is opened through
    it: under a data root and outside the state dir, checked on the file actually opened."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"{directory} holds no *.safetensors file; fine-tuning needs the "
            "weights next to config.json (save_pretrained writes both)"
        )
    seen: set[str] = set()
    nbytes = 0
    with torch.no_grad():
        for path in files:
            checked = access.open(path, "model.path") if access else nullcontext(str(path))
            with checked as real, open(real, "rb", buffering=0) as f:
                header, data_start = read_header(f)
                # in file order: the reads run sequentially through the shard
                for name, entry in sorted(header.items(), key=lambda e: e[1]["data_offsets"]):
                    if name not in views:  # a tensor's name, not its data: named, cut short
                        raise ValueError(
                            f"{path.name} holds {name[:100]!r}, which a model of this "
                            "config.json does not have; is config.json the one "
                            "these weights were saved with?"
                        )
                    shape = tuple(entry["shape"])
                    if shape != tuple(views[name].shape):
                        raise ValueError(
                            f"{path.name}: {name!r} has another shape than the "
                            f"{tuple(views[name].shape)} the config implies"
                        )
                    if entry["dtype"] not in DTYPES:
                        raise ValueError(
                            f"{path.name}: {name!r} has a dtype wstrain does not read; "
                            f"it reads {sorted(DTYPES)}"
                        )
                    begin, end = entry["data_offsets"]
                    f.seek(data_start + begin)
                    _read_into(f, views[name], DTYPES[entry["dtype"]], end - begin)
                    nbytes += end - begin
                    seen.add(name)
    missing = sorted(set(views) - seen)
    if missing:
        raise ValueError(f"{directory} lacks {len(missing)} weights, e.g. {missing[:3]}")
    log.info("loaded %d tensors (%.2f GB) from %s", len(seen), nbytes / 1e9, directory)
    return nbytes
