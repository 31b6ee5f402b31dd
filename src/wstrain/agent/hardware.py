"""What the agent learns of its host: its memory, its measured profile (GPUs, matmul and
copy rates, attention at several lengths; run as `python -m wstrain.worker.profile.node` in
a child process, since the agent never imports torch; a GPU-less host's cached one read
directly) and, per job on a GPU, one real
decoder layer of the job's model timed there (ProTrain's refinement), both cached under the
state dir.

Used by agent/agent.py and launch.py (layer times).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

from wstrain.contracts.calibration import GIB
from wstrain.contracts.hardware import Device, LayerTimes, cpu_profile_cache_key
from wstrain.contracts.jobs import GPUInfo
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.layouts import PIECES_FROM_TOKENS

log = logging.getLogger(__name__)

# a job's spill subdirectory is named by its id (store/job_store.py: 12 hex digits)
JOB_SUBDIR = re.compile(r"[0-9a-f]{12}")


class Measured(NamedTuple):
    device: Device
    gpus: list[GPUInfo]
    profile: dict[str, float]
    key: str  # the profile's cache key: GPU, driver, torch
    cached: bool  # read from the state dir's cache, not measured now


def host_memory() -> tuple[int, int]:
    """(MemTotal, MemAvailable) of /proc/meminfo, in bytes."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"], info["MemAvailable"]


def _cached_cpu_profile(cache_dir: Path) -> Measured | None:
    """A GPU-less host's cached profile, read without the profiling child: that child's
    torch import alone is ~2.5 CPU-s on a 2-core host, the whole of an agent's start when
    its profile is cached. None where the host has a GPU driver (the child then reads the
    GPUs' names and free memory) or nothing is cached under this torch's key."""
    if Path("/dev/nvidiactl").exists():
        return None
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = cache_dir / f"{cpu_profile_cache_key(os.cpu_count() or 1, torch_version)}.json"
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return Measured("cpu", [], found["profile"], found["key"], True)


async def measure_node(state_dir: Path, use_cache: bool, spill_dir: Path | None = None) -> Measured:
    """The node's profile (cached where `use_cache`), with the spill directory's disk rates
    measured afresh when there is one (the directory is not part of the cache key)."""
    m = await _measure_node(state_dir, use_cache)
    if spill_dir is not None:
        m.profile.update(await _disk_rates(spill_dir))
    return m


async def spill_space(spill_dir: Path, profile: dict[str, float]) -> int:
    """The spill directory's free bytes once no worker of this node runs (the agent's first
    reap): what jobs left there first removed, their subdirectories (a SIGKILLed worker's,
    or one of a previous agent process), so it is not counted as used forever."""

    def sweep() -> tuple[int, int]:
        left = [
            e for e in spill_dir.iterdir()
            if JOB_SUBDIR.fullmatch(e.name) and e.is_dir() and not e.is_symlink()
        ]  # fmt: skip
        for entry in left:
            shutil.rmtree(entry, ignore_errors=True)
        return len(left), shutil.disk_usage(spill_dir).free

    removed, free = await asyncio.to_thread(sweep)
    log.info(
        "spill directory %s: %.3g GiB free (%d jobs' leftovers removed), read %.3g GB/s, "
        "write %.3g GB/s, both ways in the spill's order %.3g GB/s",
        spill_dir,
        free / GIB,
        removed,
        profile.get("disk_read_bytes_per_s", 0.0) / 1e9,
        profile.get("disk_write_bytes_per_s", 0.0) / 1e9,
        profile.get("disk_both_bytes_per_s", 0.0) / 1e9,
    )
    return free


async def _disk_rates(spill_dir: Path) -> dict[str, float]:
    """disk_read_bytes_per_s, disk_write_bytes_per_s and disk_both_bytes_per_s of
    `spill_dir`, measured in a child (worker/profile/disk.py: direct I/O, a few hundred MiB
    written, read, moved both ways and removed)."""
    spill_dir.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "wstrain.worker.profile.disk",
        "--dir",
        str(spill_dir),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(
            f"measuring the spill directory {spill_dir} failed with exit {proc.returncode}: "
            "check that it exists and is writable (WSTRAIN_SPILL_DIR), or unset it"
        )
    rates: dict[str, float] = json.loads(out)
    return rates


async def _measure_node(state_dir: Path, use_cache: bool) -> Measured:
    if use_cache and (cpu := _cached_cpu_profile(state_dir / "profiles")) is not None:
        return cpu
    cache = ["--cache-dir", str(state_dir / "profiles")]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "wstrain.worker.profile.node",
        *(cache if use_cache else []),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"hardware profiling failed with exit {proc.returncode}")
    measured = json.loads(out)
    return Measured(
        measured["device"],
        [GPUInfo(**g) for g in measured["gpus"]],
        measured["profile"],
        measured["key"],
        bool(measured.get("cached")),
    )


async def layer_times(
    state_dir: Path, profile_key: str, spec: JobSpec, dims: ModelDims, jdir: Path, gpu: int
) -> LayerTimes | None:
    """The job's layer timed on GPU `gpu`, cached per model shape, sequence length,
    precision and hardware; None on failure (the planner then plans from FLOPs), and None
    for a sequence long enough to be planned in pieces: a whole layer at that length is
    what may not fit beside the GPU's other jobs (and takes seconds a pass at 512K)."""
    if spec.seq_len >= PIECES_FROM_TOKENS:
        return None
    key = hashlib.sha256(
        json.dumps([dataclasses.asdict(dims), spec.seq_len, spec.precision, profile_key]).encode()
    )
    cache = state_dir / "profiles" / "layers" / f"{key.hexdigest()[:16]}.json"
    if not cache.exists():
        # the dims the agent read through the data access, not the model's path: the timing
        # process reads no file a user named
        (jdir / "dims.json").write_text(json.dumps(dataclasses.asdict(dims)))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "wstrain.worker.profile.layer",
            "--spec",
            str(jdir / "spec.json"),
            "--dims",
            str(jdir / "dims.json"),
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)},
        )
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            log.warning("layer profile failed (exit %s); planning from FLOPs", proc.returncode)
            return None
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(out)
    return LayerTimes.from_json(json.loads(cache.read_text()))
