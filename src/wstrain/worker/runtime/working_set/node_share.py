"""One host copy of the working-set training state for the ranks of one node.

Data parallel on N GPUs of a node keeps weights, gradients, AdamW moments (and in mixed
precision the fp32 master) once, in shared memory every rank maps and page-locks in its own
process: host memory stays one job's state (8 bytes a parameter in bf16) instead of N
copies (DeepSpeed's offload grows with the GPU count, its issue #5290). Rank r owns the r-th
span of every tile: it sends that span of each summed gradient home and runs AdamW on it;
a per-(rank, group) counter in the same shared memory says which updates are done, so a
rank reads a group's weights only once every rank has updated its span.

Each tile is a file in `directory` (tmpfs: /dev/shm) named by a token rank 0 draws, so two
jobs never meet; `posix_fallocate` reserves its pages (a full tmpfs is an error at start,
not a SIGBUS mid-step) and the files are unlinked once every rank has mapped them, so
nothing outlives the job's processes.

    share = NodeShare.create(group, Path("/dev/shm"))   # collective: every rank calls it
    arena = HostArena(pin=True, share=share); ...; share.unlink()   # after a barrier
"""

from __future__ import annotations

import mmap
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from wstrain.contracts.calibration import ALIGN_ELEMS, GIB
from wstrain.contracts.errors import BudgetExceeded
from wstrain.worker.runtime.distributed import ProcessGroup
from wstrain.worker.runtime.working_set.arena import SharedRegions

# how often a rank looks at its peers' update counters while it waits for them: a
# Llama-8B layer's host AdamW takes ~31 ms (host_optim.py), so 0.2 ms costs < 1% of a wait
PEER_POLL_S = 0.0002


def shard_span(numel: int, rank: int, world: int) -> tuple[int, int]:
    """Rank `rank`'s elements [lo, hi) of a tile of `numel`: near-equal runs cut at
    ALIGN_ELEMS multiples, so each starts 256-byte aligned in bf16 (the last rank's may be
    shorter, or empty on a tiny tile)."""
    per = -(-numel // world)
    per = -(-per // ALIGN_ELEMS) * ALIGN_ELEMS
    lo = min(rank * per, numel)
    return lo, min(lo + per, numel)


@dataclass
class NodeShare:
    rank: int
    world: int
    directory: Path
    token: str
    paths: list[Path] = field(default_factory=list)

    @classmethod
    def create(cls, group: ProcessGroup, directory: Path) -> NodeShare:
        """Every rank of `group` calls this: rank 0's token and the node's index name the
        files, so each node of a several-node job keeps its own copy."""
        token = group.broadcast_token(secrets.token_hex(8))
        node = group.rank // group.local_world
        return cls(group.local_rank, group.local_world, directory, f"{token}-n{node}")

    def map(self, name: str, nbytes: int) -> mmap.mmap:
        """The shared region `name` of `nbytes` (a page multiple), zero-filled at creation;
        every rank that maps the same name sees the same memory."""
        path = self.directory / f"wstrain-{self.token}-{name}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                free = os.statvfs(self.directory)
                raise BudgetExceeded(
                    f"shared host memory for tile {name} ({nbytes / GIB:.3f} GiB) does not "
                    f"fit {self.directory} ({free.f_bavail * free.f_frsize / GIB:.2f} GiB "
                    f"free): {exc}. Mount a larger tmpfs there or point WSTRAIN_SHM_DIR at "
                    "one (the data-parallel working set keeps its state in shared memory)",
                    tile_bytes=nbytes,
                ) from exc
            region = mmap.mmap(fd, nbytes, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        if self.rank == 0:
            self.paths.append(path)
        return region

    def unlink(self) -> None:
        """Remove the files (rank 0, once every rank has mapped them): the memory stays
        while any process maps it and goes with the last one."""
        for path in self.paths:
            path.unlink(missing_ok=True)
        self.paths.clear()


class UpdateCounters:
    """Updates done per (rank, group), in shared memory (a private tensor on one rank)."""

    def __init__(self, groups: int, share: SharedRegions | None) -> None:
        world = share.world if share is not None else 1
        self.rank = share.rank if share is not None else 0
        self._region = (
            share.map("updates", max(mmap.PAGESIZE, world * groups * 8))
            if share is not None
            else None
        )
        self.counts = (  # (world, groups)
            torch.frombuffer(self._region, dtype=torch.int64, count=world * groups).view(
                world, groups
            )
            if self._region is not None
            else torch.zeros(1, groups, dtype=torch.int64)
        )

    def mark(self, group: int) -> None:
        """This rank's span of `group` is updated (after its writes: x86 keeps store order)."""
        self.counts[self.rank, group] += 1

    def wait_peers(self, group: int) -> None:
        """Until every rank has done as many updates of `group` as this one."""
        mine = int(self.counts[self.rank, group])
        while int(self.counts[:, group].min()) < mine:
            time.sleep(PEER_POLL_S)
