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

from wstrain.scheduler.contracts.access import DataAccess

log = logging.getLogger(__name__)

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}
CONVERT_BYTES = 64 * 1024**2  # conversion buffer when the file's dtype is not the state's


def read_header(f: BinaryIO | io.RawIOBase) -> tuple[dict[str, dict[str, Any]], int]:
    """(tensor entries by name, byte offset of the data section) of a safetensors file."""
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
    header.pop("__metadata__", None)
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
                    if name not in views:
                        raise ValueError(
                            f"{path.name} holds {name!r}, which a model of this "
                            "config.json does not have; is config.json the one "
                            "these weights were saved with?"
                        )
                    shape = tuple(entry["shape"])
                    if shape != tuple(views[name].shape):
                        raise ValueError(
                            f"{path.name}: {name!r} has shape {shape}, the "
                            f"config implies {tuple(views[name].shape)}"
                        )
                    if entry["dtype"] not in DTYPES:
                        raise ValueError(
                            f"{path.name}: {name!r} has dtype {entry['dtype']}; "
                            f"wstrain reads {sorted(DTYPES)}"
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
