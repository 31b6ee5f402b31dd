"""The disk tier's file and its I/O: the AdamW moments of the last `spilled_layers` decoder
layers (WorkingSetPlan.spilled_layers) live in `<spill_dir>/moments.bin`, preallocated at
start, one record a layer: m at offset 0, v at the next 4 KiB boundary. Reads and writes go
in SPILL_IO_BLOCK_BYTES blocks on a pool of SPILL_IO_THREADS threads, straight between the
file and page-aligned host buffers (arena tiles: each its own mapping, page-rounded).

O_DIRECT keeps the page cache out of it: buffered, every spilled byte read or written would
also sit in the page cache, host memory no budget counts. A file system that refuses O_DIRECT
(EINVAL: tmpfs before Linux 6.6, some network file systems) gets buffered I/O, each block
written then fdatasync'd, and posix_fadvise(DONTNEED) after each block, which drops its
now clean pages (tmpfs pages are memory either way).

    f = SpillFile.create(spill_dir, layers=4, layout=RecordLayout.of(numel, torch.bfloat16),
                         disk_limit_bytes=spec.budget.disk_bytes)
    op = f.write(record=2, buffers=[m_view, v_view]); op.wait()   # seconds waited
    f.read(2, [m_view, v_view], after=op).wait()                  # chained: write, then read
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from wstrain.contracts.calibration import GIB, SPILL_IO_BLOCK_BYTES, SPILL_IO_THREADS
from wstrain.contracts.errors import BudgetExceeded

log = logging.getLogger(__name__)

SPILL_FILE = "moments.bin"
# O_DIRECT wants buffer addresses, offsets and lengths aligned to the device's logical block
# (512 B or 4 KiB); a page (4 KiB on x86-64 and the H200 hosts) satisfies both
ALIGN_BYTES = mmap.PAGESIZE
# Fault injection for tests only (tests/worker/test_spill_worker.py, docs/OPERATIONS.md): the
# worker SIGKILLs itself inside its n-th spill-file write (1-based), after its first block
# went out, as a crash mid-write would leave the file; unset in service
FAULT_KILL_IN_SPILL_WRITE_ENV = "WSTRAIN_FAULT_KILL_IN_SPILL_WRITE"


def align_up(n_bytes: int) -> int:
    return -(-n_bytes // ALIGN_BYTES) * ALIGN_BYTES


@dataclass(frozen=True)
class RecordLayout:
    """One layer's record: m at 0, v at `v_offset`, both 4 KiB aligned for O_DIRECT. The
    planner counts spilled_layers x (m + v) bytes on disk; the records pad each moment to
    4 KiB, nothing where a layer's elements are a multiple of 2048 (bf16) as in every Llama-3
    layer, under 8 KiB a layer otherwise (the toy models' layers)."""

    numel: int  # elements of m (and of v)
    dtype: torch.dtype
    moment_bytes: int  # one moment's tensor bytes (what the arena counts)
    v_offset: int
    record_bytes: int

    @classmethod
    def of(cls, numel: int, dtype: torch.dtype) -> RecordLayout:
        moment_bytes = numel * torch.empty((), dtype=dtype).element_size()
        return cls(numel, dtype, moment_bytes, align_up(moment_bytes), 2 * align_up(moment_bytes))


class SpillIOError(OSError):
    """A spill read or write failed: names the file, the offset and the bytes."""


class SpillSpaceError(OSError):
    """The spill directory cannot hold the spill file (ENOSPC at preallocation, before any
    step): names the directory, the bytes needed and free, and the fix."""


class IoOp:
    """One read or write of buffers at an offset: its blocks on the pool, done when all are.
    `after`: an op that must finish first (a slot's write-back before its next read)."""

    def __init__(self, what: str, tasks: list[Callable[[], None]]) -> None:
        self.what = what
        self._tasks = tasks
        self._left = len(tasks)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._next: list[Callable[[], None]] = []
        self.error: BaseException | None = None

    def _run_block(self, task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as exc:  # kept for wait() on the thread that needs the data
            self.error = self.error or exc
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._finish()

    def _finish(self) -> None:
        with self._lock:
            self._done.set()
            follow, self._next = self._next, []
        for fn in follow:
            fn()

    def then(self, fn: Callable[[], None]) -> None:
        """Call `fn` once this op is done (at once if it is)."""
        with self._lock:
            if not self._done.is_set():
                self._next.append(fn)
                return
        fn()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> float:
        """Block until done; the seconds waited. Raises the first block's error."""
        t0 = time.perf_counter()
        self._done.wait()
        waited = time.perf_counter() - t0
        if self.error is not None:
            raise SpillIOError(
                getattr(self.error, "errno", None) or errno.EIO, f"{self.what}: {self.error}"
            ) from self.error
        return waited


DONE = IoOp("nothing", [])
DONE._finish()


class RawFile:
    """A file of `size_bytes` read and written in aligned blocks on a thread pool; O_DIRECT
    unless the file system refuses it or `buffered` asks for the fallback."""

    def __init__(
        self,
        path: Path,
        size_bytes: int,
        create: bool,
        buffered: bool = False,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        self.path, self.size_bytes = path, size_bytes
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC if create else os.O_RDONLY
        self.direct = False
        self.fd = -1
        if not buffered and hasattr(os, "O_DIRECT"):
            try:
                self.fd = os.open(path, flags | os.O_DIRECT, 0o600)
                self.direct = True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                log.info("%s: no O_DIRECT here (%s); buffered I/O + fadvise(DONTNEED)", path, exc)
        if self.fd < 0:
            self.fd = os.open(path, flags, 0o600)
        self._own_pool = pool is None
        self.pool = pool or ThreadPoolExecutor(SPILL_IO_THREADS, thread_name_prefix="spill-io")
        self.writes = 0  # writes issued (the fault injection counts them)

    def _blocks(self, offset: int, buffers: list[memoryview]) -> list[tuple[int, memoryview]]:
        out, at = [], offset
        for buf in buffers:
            n = len(buf)
            if self.direct:
                assert at % ALIGN_BYTES == 0 and n % ALIGN_BYTES == 0, (at, n)
            for lo in range(0, n, SPILL_IO_BLOCK_BYTES):
                out.append((at + lo, buf[lo : lo + SPILL_IO_BLOCK_BYTES]))
            at += align_up(n)
        assert at <= self.size_bytes, f"{self.path}: I/O to {at} past its {self.size_bytes} bytes"
        return out

    def _op(self, kind: str, offset: int, buffers: list[memoryview], after: IoOp) -> IoOp:
        def block(at: int, buf: memoryview) -> Callable[[], None]:
            def run() -> None:
                try:
                    if kind == "read":
                        done = os.preadv(self.fd, [buf], at)
                    else:
                        done = os.pwritev(self.fd, [buf], at)
                    if done != len(buf):
                        raise OSError(errno.EIO, f"short {kind}: {done} of {len(buf)} bytes")
                    if not self.direct:  # keep the page cache from holding what went by:
                        if kind == "write":  # DONTNEED drops clean pages only
                            os.fdatasync(self.fd)
                        os.posix_fadvise(self.fd, at, len(buf), os.POSIX_FADV_DONTNEED)
                except OSError as exc:
                    raise OSError(
                        exc.errno, f"{kind} of {len(buf)} bytes at offset {at}: {exc.strerror}"
                    ) from exc

            return run

        tasks = [block(at, buf) for at, buf in self._blocks(offset, buffers)]
        op = IoOp(f"spill {kind} of {self.path} at offset {offset}", tasks)
        if kind == "write":
            self.writes += 1
            fault = os.environ.get(FAULT_KILL_IN_SPILL_WRITE_ENV)
            if fault and int(fault) == self.writes and isinstance(self, SpillFile):
                after.wait()
                op._tasks[0]()  # part of the record goes out, then the process dies
                log.warning("fault injection: SIGKILL inside spill write %d", self.writes)
                os.kill(os.getpid(), signal.SIGKILL)

        def submit() -> None:
            if after.error is not None:  # what this op would order after failed: so did it
                op.error = after.error
                op._finish()
                return
            if not op._tasks:
                op._finish()
            for task in op._tasks:
                self.pool.submit(op._run_block, task)

        after.then(submit)
        return op

    def read(self, offset: int, buffers: list[memoryview], after: IoOp = DONE) -> IoOp:
        """Fill `buffers` from `offset` on (each buffer at the next 4 KiB boundary)."""
        return self._op("read", offset, buffers, after)

    def write(self, offset: int, buffers: list[memoryview], after: IoOp = DONE) -> IoOp:
        return self._op("write", offset, buffers, after)

    def close(self) -> None:
        if self._own_pool:
            self.pool.shutdown(wait=True)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


class SpillFile(RawFile):
    """`<spill_dir>/moments.bin`: `layers` records of `layout`, zeros at the start (a stale
    file of a killed worker is truncated and allocated afresh)."""

    def __init__(
        self, spill_dir: Path, layers: int, layout: RecordLayout, buffered: bool = False
    ) -> None:
        self.spill_dir, self.layers, self.layout = spill_dir, layers, layout
        super().__init__(spill_dir / SPILL_FILE, layers * layout.record_bytes, True, buffered)

    @classmethod
    def create(
        cls,
        spill_dir: Path,
        layers: int,
        layout: RecordLayout,
        disk_limit_bytes: int | None,
        buffered: bool = False,
    ) -> SpillFile:
        """The preallocated spill file; BudgetExceeded past `disk_limit_bytes` (the disk
        budget; None: unchecked), OSError(ENOSPC) naming the bytes when the disk is full."""
        needed = layers * layout.record_bytes
        if disk_limit_bytes is not None and needed > disk_limit_bytes:
            raise BudgetExceeded(
                f"the spill file of {layers} layers' AdamW moments needs {needed} bytes "
                f"({needed / GIB:.3f} GiB, {layout.record_bytes} a layer) but budget.disk_gib "
                f"allows {disk_limit_bytes} bytes ({disk_limit_bytes / GIB:.3f} GiB), room for "
                f"{disk_limit_bytes // layout.record_bytes} layers. The plan over-spilled: "
                f"raise budget.disk_gib to at least {needed / GIB:.3f} or the host budget, and "
                "report the plan",
                disk_bytes=needed,
                disk_limit_bytes=disk_limit_bytes,
            )
        spill_dir.mkdir(parents=True, exist_ok=True)
        f = cls(spill_dir, layers, layout, buffered)
        try:
            if needed:
                os.posix_fallocate(f.fd, 0, needed)
        except OSError as exc:
            f.close()
            (spill_dir / SPILL_FILE).unlink(missing_ok=True)
            if exc.errno != errno.ENOSPC:
                raise
            raise SpillSpaceError(
                errno.ENOSPC,
                f"no space for the spill file in {spill_dir}: it needs {needed} bytes "
                f"({layers} layers' AdamW moments) and the file system has "
                f"{_free_bytes(spill_dir)} bytes free. Free space there, point the worker's "
                "--spill-dir at a larger local disk, or lower budget.disk_gib so the plan "
                "spills less",
            ) from exc
        log.info(
            "spill file %s: %d layers, %d bytes (%s I/O)",
            f.path,
            layers,
            needed,
            "direct" if f.direct else "buffered",
        )
        return f

    def offset(self, record: int) -> int:
        assert 0 <= record < self.layers, (record, self.layers)
        return record * self.layout.record_bytes

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def remove_spill_file(spill_dir: Path) -> None:
    """A clean exit leaves no spill file behind (a killed worker's is overwritten at the
    next start)."""
    (spill_dir / SPILL_FILE).unlink(missing_ok=True)
