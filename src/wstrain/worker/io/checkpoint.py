"""Checkpoints: weights as safetensors with Hugging Face names, sharded with an index file as
`save_pretrained` writes them (+ config.json, so `AutoModelForCausalLM.from_pretrained(dir)`
loads them), optimizer and LR-schedule state, step, data position and RNG state. Written
atomically: into a temp dir, fsynced, renamed, then the `latest` pointer replaced. Weights
may be views into the training state: each shard is copied out only while it is written, so
a checkpoint costs at most one shard of extra host memory.

    save(root, TrainerState(step, step), runtime.state_tensors(), runtime.optimizer_state(), cfg)
    state, extra = load_meta(latest(root)); runtime.load_state(latest(root), extra)
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from wstrain.contracts.calibration import CHECKPOINT_SHARD_BYTES

log = logging.getLogger(__name__)

LATEST = "latest"
SHARD_BYTES = CHECKPOINT_SHARD_BYTES  # a module attribute so tests can shrink it
INDEX = "model.safetensors.index.json"


# extra[FILES]: files the runtime streams into the checkpoint itself (name -> StreamedFile),
# such as the spilled layers' AdamW moments (working_set/spilled.py), which never fit in
# host memory at once; load_meta gives the runtime the directory (extra[CHECKPOINT_DIR])
FILES = "files"
CHECKPOINT_DIR = "checkpoint_dir"


class StreamedFile(Protocol):
    nbytes: int

    def write(self, path: Path) -> None: ...


@dataclass(frozen=True)
class TrainerState:
    step: int  # optimizer steps completed
    data_position: int  # sequences of the data order consumed (= step * global_batch)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(
    root: Path,
    state: TrainerState,
    tensors: dict[str, torch.Tensor],
    extra: dict[str, object],
    hf_config: dict[str, object],
    keep: int = 2,
) -> Path:
    """tensors: weights under Hugging Face names; extra: the runtime's optimizer state. Keeps
    the newest `keep` checkpoints. A write that fails (a full disk) removes what it wrote
    and raises OSError naming the path and, for a full disk, the bytes free on it; the
    previous checkpoint stays valid."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a process killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{state.step:08d}"
    pointer = root / f".{LATEST}.tmp"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        _write(tmp, state, tensors, extra, hf_config)
        if final.exists():  # a re-run of the same step after a crash: replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        pointer.write_text(final.name)
        os.replace(pointer, root / LATEST)
        _fsync_dir(root)
    # safetensors reports I/O errors as its own; torch.save's writer as a RuntimeError
    # ("unexpected pos 669760 vs 669652" for a full disk)
    except (OSError, SafetensorError, RuntimeError) as exc:
        free_bytes = _free_bytes(root)  # before the clean-up frees what this write took
        code = _errno(exc)
        # short: the file system refused bytes while statvfs still counts space free
        short = code is None and free_bytes >= FULL_DISK_BYTES and SHORT_WRITE in str(exc)
        if code is None and (free_bytes < FULL_DISK_BYTES or short):
            code = errno.ENOSPC
        quota = code == errno.EDQUOT  # a disk quota: the same fix as a full disk
        shutil.rmtree(tmp, ignore_errors=True)
        pointer.unlink(missing_ok=True)
        previous = latest(root)
        if final.exists() and previous != final:  # renamed, but `latest` not moved to it
            shutil.rmtree(final, ignore_errors=True)
        if isinstance(exc, RuntimeError) and code != errno.ENOSPC and not quota:
            raise  # not the disk: a bug, as it was
        # torch's writer leaves its file open in the failed call's frames, which the error
        # keeps: the deleted file would hold its blocks until the error is gone
        chained: BaseException | None = exc
        seen: set[int] = set()
        while chained is not None and id(chained) not in seen:
            seen.add(id(chained))
            traceback.clear_frames(chained.__traceback__)
            chained = chained.__cause__ or chained.__context__
        kept = f"{previous} stays valid" if previous else "there is no earlier checkpoint"
        if code == errno.ENOSPC or quota:
            space = (
                f"{root}: {free_bytes} of {_total_bytes(root)} bytes free; this checkpoint "
                f"takes about {_checkpoint_bytes(tensors, extra)} bytes"
            )
            what = f"no space left on device ({space})"
            if quota:
                what = f"disk quota exceeded ({space})"
            elif short:
                what = f"the file system took only part of a write: a full disk or quota ({space})"
            fix = (
                "Free space on that file system (or give the state dir a larger one), or "
                "lower keep_checkpoints, then resume the job"
            )
        else:
            what, fix = f"{exc}", "fix the state dir, then resume the job"
        raise OSError(
            code, f"checkpoint of step {state.step} not written: {what}; {kept}. {fix}"
        ) from exc
    _prune(root, keep)
    log.info("checkpoint written: %s", final)
    return final


# A write that fails with less than this free on its file system met a full disk: torch's
# writer does not say ENOSPC, and a failed write leaves less than one write's worth free
# (the kernel fills the disk to its last block first).
FULL_DISK_BYTES = 1 << 20
# torch's writer's words for a write the file system took only part of: a full disk even
# where statvfs still counts free space (the lent GPU machines' virtio disk stopped a
# checkpoint at 4.8 GB of a file with tens of GB reported free: its 64 GiB quota sits
# under a 252 GiB file system)
SHORT_WRITE = "unexpected pos"


def _free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still take on `path`'s file system."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _total_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def _checkpoint_bytes(tensors: dict[str, torch.Tensor], extra: object) -> int:
    """The weights' and the optimizer state's tensor bytes: about a checkpoint's size."""
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if isinstance(extra, dict):
        total += sum(f.nbytes for f in cast(dict[str, StreamedFile], extra.get(FILES, {})).values())
    todo = [extra]
    while todo:
        item = todo.pop()
        if isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
        elif isinstance(item, dict):
            todo.extend(v for k, v in item.items() if k != FILES)
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
    return total


def _errno(exc: BaseException) -> int | None:
    """The OS error number of a failed write, also from safetensors' "(os error 28)"."""
    if isinstance(exc, OSError):
        return exc.errno
    found = re.search(r"os error (\d+)", str(exc))
    return int(found.group(1)) if found else None


def _write(
    out: Path,
    state: TrainerState,
    tensors: dict[str, torch.Tensor],
    extra: dict[str, object],
    hf_config: dict[str, object],
) -> None:
    _save_sharded(tensors, out)
    (out / "config.json").write_text(json.dumps(hf_config, indent=1))
    extra = dict(extra)
    for name, streamed in cast(dict[str, StreamedFile], extra.pop(FILES, {})).items():
        streamed.write(out / name)
    rng: dict[str, object] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save({**extra, "rng": rng}, out / "optimizer.pt")
    (out / "trainer.json").write_text(json.dumps(state.__dict__))
    for f in out.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def _prune(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (never the one `latest` names)."""
    current = latest(root)
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[: max(0, len(steps) - keep)]:
        if old != current:
            shutil.rmtree(old, ignore_errors=True)
            log.info("checkpoint pruned: %s (keeping %d)", old, keep)


def _save_sharded(tensors: dict[str, torch.Tensor], out: Path) -> None:
    shard_bytes = SHARD_BYTES
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    n = len(shards)
    weight_map = {}
    for i, names in enumerate(shards):
        fname = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        # views into the training state share storage: copy this shard out, write, drop it
        save_file(
            {k: tensors[k].detach().cpu().clone() for k in names},
            out / fname,
            metadata={"format": "pt"},
        )
        weight_map.update(dict.fromkeys(names, fname))
    if n > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (out / INDEX).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
        )


def latest(root: Path) -> Path | None:
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if path.is_dir() else None


def load(path: Path) -> tuple[TrainerState, dict[str, torch.Tensor], dict[str, object]]:
    """(trainer state, weights by Hugging Face name, the runtime's optimizer state). Reads
    every weight into memory; a runtime resuming streams them instead (load_meta)."""
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        weights.update(load_file(shard))
    state, extra = load_meta(path)
    return state, weights, extra


def load_meta(path: Path) -> tuple[TrainerState, dict[str, object]]:
    """(trainer state, the runtime's optimizer state); restores the RNG state."""
    extra = torch.load(path / "optimizer.pt", weights_only=False)
    rng = extra.pop("rng")
    extra[CHECKPOINT_DIR] = str(path)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return TrainerState(**json.loads((path / "trainer.json").read_text())), extra
