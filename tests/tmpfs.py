"""A small file system of a test's own, to fill up without filling the host's: a tmpfs
mounted under the test's tmp dir (we run as root in CI and here; where mount is refused a
test skips, saying why, except under CI=true, where it fails).

    with small_fs(tmp_path / "disk", "4m") as disk: ballast = fill(disk); ...; ballast.unlink()
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_fs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's "4m") at `path`, unmounted on exit."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        # CI runs as root, where mount works: there a refusal is a broken machine, not a skip
        refuse = pytest.fail if os.environ.get("CI") == "true" else pytest.skip
        refuse(
            f"cannot mount a {size} tmpfs at {path} ({done.stderr.strip() or done.returncode}):"
            " the full-disk tests need root (or CAP_SYS_ADMIN)"
        )
    try:
        yield path
    finally:
        # lazy: a process of the test that still holds a file there lets go when it exits
        subprocess.run(["umount", "-l", str(path)], check=False)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(disk: Path, leave_bytes: int = 0) -> Path:
    """Take every free byte of `disk` but about `leave_bytes` with one file; deleting the
    file frees them again."""
    ballast = disk / "ballast"
    with open(ballast, "wb", buffering=0) as out:
        if leave_bytes:
            out.write(b"\0" * max(0, free_bytes(disk) - leave_bytes))
            return ballast
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    out.write(b"\0" * chunk)
            except OSError:
                pass
    assert free_bytes(disk) == 0
    return ballast
