"""The spill directory's disk bandwidth for the node profile (contracts/hardware.py
NodeProfile.disk_read_bytes_per_s / disk_write_bytes_per_s / disk_both_bytes_per_s): a temp
file written, then read, as the disk tier moves a spilled layer's moments
(working_set/spill.py): direct I/O where the file system takes it, SPILL_IO_BLOCK_BYTES
blocks on SPILL_IO_THREADS threads; then its records read and written back in the spill's
own order (two slots, each read chained after the write that frees its slot), which is what
a step gets and can differ from the two directions apart (lent H200s' disks: 2.25-2.30 GB/s
both ways on one, against 2.1 at its separate rates; 2.20 against 2.25 on another);
removed after.

    disk_bandwidth(Path("/nvme/spill"))   # {"disk_read_bytes_per_s": ..., "disk_write_...": ...}
    python -m wstrain.worker.profile.disk --dir /nvme/spill   # the same, as JSON (the agent)
"""

from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import sys
import tempfile
import time
from pathlib import Path

from wstrain.contracts.calibration import MIB, SPILL_IO_BLOCK_BYTES, SPILL_SLOTS
from wstrain.worker.runtime.working_set.spill import ALIGN_BYTES, DONE, IoOp, RawFile, align_up

log = logging.getLogger(__name__)


# records the probe file is cut into for the spill's order: enough that the steady part
# (a write and the next read in flight) outweighs the SPILL_SLOTS reads that start it
PATTERN_RECORDS = 8


def _spill_order_s(f: RawFile, record_bytes: int, slots: list[memoryview]) -> float:
    """Seconds to read and write back PATTERN_RECORDS records of `f` as the host update
    moves spilled layers (working_set/spill.py): the first SPILL_SLOTS reads at once, then
    each record, once read, written back, and the slot's next read chained after it."""
    start = time.perf_counter()
    reads: dict[int, IoOp] = {}
    for j in range(SPILL_SLOTS):
        reads[j] = f.read(j * record_bytes, [slots[j]])
    last = DONE
    for j in range(PATTERN_RECORDS):
        reads[j].wait()
        last = f.write(j * record_bytes, [slots[j % SPILL_SLOTS]])
        if j + SPILL_SLOTS < PATTERN_RECORDS:
            at = (j + SPILL_SLOTS) * record_bytes
            reads[j + SPILL_SLOTS] = f.read(at, [slots[j % SPILL_SLOTS]], after=last)
    last.wait()
    return time.perf_counter() - start


def disk_bandwidth(
    directory: Path, nbytes: int = 256 * MIB, buffered: bool = False
) -> dict[str, float]:
    """Bytes/s written (as the spill file writes) and read back of an `nbytes` file in
    `directory`, and moved both ways in the spill's order (`buffered` forces the fallback
    where O_DIRECT is refused anyway)."""
    directory.mkdir(parents=True, exist_ok=True)
    nbytes = align_up(max(nbytes, SPILL_IO_BLOCK_BYTES))
    # one page-aligned buffer of the whole size, random bytes: a disk that compresses or
    # dedups zeros would report what no moment gets
    buf = mmap.mmap(-1, nbytes)
    buf[:SPILL_IO_BLOCK_BYTES] = os.urandom(SPILL_IO_BLOCK_BYTES)
    for at in range(SPILL_IO_BLOCK_BYTES, nbytes, SPILL_IO_BLOCK_BYTES):
        n = min(SPILL_IO_BLOCK_BYTES, nbytes - at)
        buf[at : at + n] = buf[:n]
    fd, name = tempfile.mkstemp(prefix=".wstrain-disk-probe-", dir=directory)
    os.close(fd)
    path = Path(name)
    try:
        f = RawFile(path, nbytes, create=True, buffered=buffered)
        try:
            os.posix_fallocate(f.fd, 0, nbytes)
            view = memoryview(buf)
            start = time.perf_counter()
            # no fdatasync of our own: RawFile writes as the spill file does (direct I/O
            # straight to the device, the fallback synced block by block); a sync on top
            # measured 1.6 GB/s where this measures 1.8-2.2 on the lent H200's disk
            f.write(0, [view]).wait()
            write_s = time.perf_counter() - start
            start = time.perf_counter()
            f.read(0, [view]).wait()
            read_s = time.perf_counter() - start
            record = nbytes // PATTERN_RECORDS // ALIGN_BYTES * ALIGN_BYTES  # within the file
            slots = [view[i * record : (i + 1) * record] for i in range(SPILL_SLOTS)]
            both_s = _spill_order_s(f, record, slots)
            direct = f.direct
        finally:
            f.close()
    finally:
        path.unlink(missing_ok=True)
    both = 2 * PATTERN_RECORDS * record / both_s
    log.info(
        "disk %s (%s I/O): write %.2f GB/s, read %.2f GB/s, both ways in the spill's order "
        "%.2f GB/s over %d MiB",
        directory,
        "direct" if direct else "buffered",
        nbytes / write_s / 1e9,
        nbytes / read_s / 1e9,
        both / 1e9,
        nbytes // MIB,
    )
    return {
        "disk_read_bytes_per_s": nbytes / read_s,
        "disk_write_bytes_per_s": nbytes / write_s,
        "disk_both_bytes_per_s": both,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="the spill directory")
    parser.add_argument("--mib", type=int, default=256, help="the probe file's size")
    args = parser.parse_args()
    json.dump(disk_bandwidth(args.dir, args.mib * MIB), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
