"""Which files a job may read: anything under the data roots (WSTRAIN_DATA_ROOTS) except the
service's own state dir, which holds every user's checkpoints.

Checked twice. The API checks the resolved path when a job is submitted (`check`); the worker
checks again the file it actually opened (`open`): the path the kernel gives for the open
descriptor (/proc/self/fd/N), so a symlink swapped in between submit and open, or between a
check and an open, cannot lead outside the roots. Readers then use /proc/self/fd/N, which is
that same file whatever happens to the path meanwhile.

    access = DataAccess.of(["/data"], state_dir="/srv/wstrain-state")
    access.check("/data/corpus.bin", "data.path")          # API: raises InvalidSpec
    with access.open("/data/corpus.bin", "data.path") as p:  # worker: p = /proc/self/fd/N
        tokens = np.memmap(p, dtype=np.uint16, mode="r")
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from wstrain.scheduler.contracts.errors import InvalidSpec

_FD_DIR = Path("/proc/self/fd")


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@dataclass(frozen=True)
class DataAccess:
    roots: tuple[Path, ...]  # resolved
    state_dir: Path | None  # resolved; nothing under it is a job's data

    @classmethod
    def of(cls, roots: Sequence[str | Path], state_dir: str | Path | None) -> DataAccess:
        """Refuses a data root that is the state dir or lies inside it: every job could
        then read every other job's checkpoints."""
        real_roots = tuple(Path(os.path.realpath(r)) for r in roots)
        real_state = Path(os.path.realpath(state_dir)) if state_dir is not None else None
        for given, root in zip(roots, real_roots):
            if real_state is not None and _inside(root, real_state):
                raise ValueError(
                    f"data root {str(given)!r} is the state dir {str(real_state)!r} or lies "
                    "inside it, which holds every job's checkpoints; set WSTRAIN_DATA_ROOTS "
                    "to the directories that hold training data and models only"
                )
        return cls(real_roots, real_state)

    def check(self, path: str, field: str) -> Path:
        """`path` resolved, if it lies under a root and outside the state dir; else
        InvalidSpec naming the field, the value and the fix."""
        return self._allowed(Path(os.path.realpath(path)), path, field)

    def _allowed(self, real: Path, given: str, field: str) -> Path:
        if not any(_inside(real, r) for r in self.roots):
            roots = [str(r) for r in self.roots]
            raise InvalidSpec(
                f"{field}={given!r} lies outside the data roots {roots}; move the file under "
                "one of them or add its directory to WSTRAIN_DATA_ROOTS"
            )
        if self.state_dir is not None and _inside(real, self.state_dir):
            raise InvalidSpec(
                f"{field}={given!r} lies inside the service's state dir {str(self.state_dir)!r}"
                ", which jobs may not read; copy what you need under a data root"
            )
        return real

    @contextlib.contextmanager
    def open(self, path: str | Path, field: str) -> Iterator[str]:
        """Open `path` for reading, check the file actually opened, and yield a path that
        names exactly that file (/proc/self/fd/N) while the block runs."""
        given = str(path)
        fd = os.open(given, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            if _FD_DIR.is_dir():
                opened = Path(os.readlink(_FD_DIR / str(fd)))
                self._allowed(opened, given, field)
                yield str(_FD_DIR / str(fd))
            else:  # no /proc: resolve the path, and make sure it is the file we hold open
                real = self.check(given, field)
                if not os.path.samestat(os.fstat(fd), os.stat(real)):
                    raise InvalidSpec(f"{field}={given!r} changed while it was opened")
                yield str(real)
        finally:
            os.close(fd)
