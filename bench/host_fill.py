"""How fast host memory becomes page-locked arena tiles: the arena's way beside five others.

The working-set runtime page-locks every host tile it streams through: the training state
before the first step, the saved-activation store's chunks as the first step asks for them
(worker/runtime/working_set/arena.py, host_store.py). One tile after another (a plain
mapping, then cudaHostRegister, which faults every page in inside the driver) the lent
H200 hosts filled at 1.4-2.4 GiB/s: the state's 59.8 GiB took 24.4-36.4 s, and at 64K tokens
with a 240 GiB host budget the first step took 55.3 s against 12.4 s after it
(bench/results/long-context/gpu-clocks-host-memory-512k-256k-64k-h200-2026-11-29.json).
This times `--gib` of 64 MiB tiles six ways, each on fresh memory:

- `arena`: HostArena.alloc_many in batches of the store's STORE_FILL_CHUNKS (the runtime's);
- `register`: a plain mapping registered as it is, one tile after another, on one thread;
- `prefault`: each tile's pages first written by `--threads` threads, then registered;
- `hugepage`: as prefault, after madvise(MADV_HUGEPAGE) (2 MiB pages where THP allows);
- `threads`: `--threads` threads each mapping and registering whole tiles;
- `threads-hugepage`: as threads, each tile advised to THP and written before registering.

    python -m bench.host_fill --gib 32 --threads 8 --out X.json

Without CUDA nothing is page-locked and the rows time the faulting alone (a write a page
where cudaHostRegister would fault them in). A row: the
method, GiB, seconds, GiB/s; the run records the host's THP settings and CPU count.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from wstrain.contracts.calibration import ACTIVATION_CHUNK_BYTES, GIB
from wstrain.worker.runtime.working_set.arena import HostArena, Tile
from wstrain.worker.runtime.working_set.host_store import STORE_FILL_CHUNKS

PAGE = mmap.PAGESIZE
METHODS = ("arena", "register", "prefault", "hugepage", "threads", "threads-hugepage")


def _register(t: torch.Tensor) -> None:
    """cudaHostRegister, which faults in every page not yet there; without CUDA, a write a
    page on this thread stands in for its faulting."""
    if not torch.cuda.is_available():
        t[::PAGE].fill_(0)
        return
    rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.nbytes, 0)
    if int(rc) != 0:
        raise RuntimeError(f"cudaHostRegister of {t.nbytes} bytes failed: {rc}")


def _unregister(tiles: list[torch.Tensor]) -> None:
    if torch.cuda.is_available():
        for t in tiles:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


def _touch(t: torch.Tensor, pool: ThreadPoolExecutor, threads: int) -> None:
    """One write a page, the tile split among `threads` page-aligned parts."""
    pages = t.numel() // PAGE
    per = -(-pages // threads) * PAGE
    parts = [t[i : i + per] for i in range(0, t.numel(), per)]
    list(pool.map(lambda p: p[::PAGE].fill_(0), parts))


def _mapped(nbytes: int, huge: bool) -> tuple[mmap.mmap, torch.Tensor]:
    region = mmap.mmap(-1, nbytes)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    return region, torch.frombuffer(region, dtype=torch.uint8, count=nbytes)


def fill(method: str, total_bytes: int, threads: int, tile_bytes: int) -> dict[str, float | str]:
    """`total_bytes` of fresh tiles made page-locked by `method`; the seconds it took."""
    n = total_bytes // tile_bytes
    keep: list[object] = []  # mappings stay alive until the tiles are unregistered
    tiles: list[torch.Tensor] = []
    start = time.perf_counter()
    if method == "arena":
        arena = HostArena(pin=torch.cuda.is_available())
        for first in range(0, n, STORE_FILL_CHUNKS):
            batch = range(first, min(n, first + STORE_FILL_CHUNKS))
            made = arena.alloc_many(
                [Tile(f"t{i}", tile_bytes, torch.uint8, "bench") for i in batch]
            )
            tiles += made
            if not arena.pin:
                for t in made:
                    _register(t)  # its stand-in: the faulting alone
        took = time.perf_counter() - start
        arena.close()
        return _row(method, n * tile_bytes, took)
    with ThreadPoolExecutor(threads) as pool:
        if method.startswith("threads"):
            huge = method == "threads-hugepage"

            def one(_: int) -> tuple[mmap.mmap, torch.Tensor]:
                region, t = _mapped(tile_bytes, huge=huge)
                if huge:
                    t[::PAGE].fill_(0)
                _register(t)
                return region, t

            for region, t in pool.map(one, range(n)):
                keep.append(region)
                tiles.append(t)
        else:
            for _ in range(n):
                region, t = _mapped(tile_bytes, huge=method == "hugepage")
                if method != "register":
                    _touch(t, pool, threads)
                _register(t)
                keep.append(region)
                tiles.append(t)
    took = time.perf_counter() - start
    _unregister(tiles)
    return _row(method, n * tile_bytes, took)


def _row(method: str, nbytes: int, took_s: float) -> dict[str, float | str]:
    return {"method": method, "gib": nbytes / GIB, "seconds": took_s,
            "gib_per_s": nbytes / GIB / took_s}  # fmt: skip


def _thp() -> dict[str, str]:
    out = {}
    for name in ("enabled", "defrag"):
        path = Path("/sys/kernel/mm/transparent_hugepage") / name
        out[name] = path.read_text().strip() if path.exists() else "absent"
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=16.0, help="host memory each method fills")
    p.add_argument("--threads", type=int, default=8, help="threads of the parallel methods")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated, in order")
    p.add_argument("--repeats", type=int, default=2, help="each method this many times")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    methods = args.methods.split(",")
    if bad := sorted(set(methods) - set(METHODS)):
        p.error(f"--methods: unknown {bad}; choose from {', '.join(METHODS)}")
    total = int(args.gib * GIB)
    rows = []
    for rep in range(args.repeats):
        for m in methods:
            row = fill(m, total, args.threads, ACTIVATION_CHUNK_BYTES) | {"repeat": rep}
            gib, took = row["gib"], row["seconds"]
            print(f"{m:9s} {gib:.1f} GiB {took:7.2f} s {row['gib_per_s']:6.2f} GiB/s")
            rows.append(row)
    run = {
        "what": "host tiles of 64 MiB made page-locked, six ways (bench/host_fill.py)",
        "commit": os.environ.get("BENCH_COMMIT", ""),
        "cuda": torch.cuda.is_available(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "thp": _thp(),
        "threads": args.threads,
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(run, indent=1))


if __name__ == "__main__":
    main()
