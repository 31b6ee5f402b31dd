"""The spill directory's disk bandwidth for the node profile (contracts/hardware.py
NodeProfile.disk_read_bytes_per_s / disk_write_bytes_per_s / disk_duplex_bytes_per_s): a temp
file written, then read, then one half read while the other is written, as the disk tier
moves spilled layers' moments (working_set/spill.py: one slot's read beside another's
write-back): direct I/O where the file system takes it, SPILL_IO_BLOCK_BYTES blocks on
SPILL_IO_THREADS threads; removed after.

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

from wstrain.contracts.calibration import MIB, SPILL_IO_BLOCK_BYTES
from wstrain.worker.runtime.working_set.spill import RawFile, align_up

log = logging.getLogger(__name__)


def disk_bandwidth(
    directory: Path, nbytes: int = 256 * MIB, buffered: bool = False
) -> dict[str, float]:
    """Bytes/s written (fdatasync'd) and read back of an `nbytes` file in `directory`, and
    the bytes/s of both directions together while `nbytes` are read and `nbytes` written at
    once (`buffered` forces the fallback where O_DIRECT is refused anyway)."""
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
        f = RawFile(path, 2 * nbytes, create=True, buffered=buffered)
        try:
            os.posix_fallocate(f.fd, 0, 2 * nbytes)
            view = memoryview(buf)
            start = time.perf_counter()
            # no fdatasync of our own: RawFile writes as the worker's spill file does (direct
            # I/O straight to the device, the fallback synced block by block); a sync on top
            # measured 1.6 GB/s where the disk tier's writes ran at ~2.2 (lent H200, 1 GiB)
            f.write(0, [view]).wait()
            write_s = time.perf_counter() - start
            start = time.perf_counter()
            f.read(0, [view]).wait()
            read_s = time.perf_counter() - start
            back = mmap.mmap(-1, nbytes)  # the read's buffer: the write keeps `buf`
            start = time.perf_counter()
            reading = f.read(0, [memoryview(back)])
            f.write(nbytes, [view]).wait()
            reading.wait()
            duplex_s = time.perf_counter() - start
            direct = f.direct
        finally:
            f.close()
    finally:
        path.unlink(missing_ok=True)
    rates = {
        "disk_read_bytes_per_s": nbytes / read_s,
        "disk_write_bytes_per_s": nbytes / write_s,
        "disk_duplex_bytes_per_s": 2 * nbytes / duplex_s,
    }
    log.info(
        "disk %s (%s I/O): read %.2f GB/s, write %.2f GB/s, both at once %.2f GB/s over %d MiB",
        directory,
        "direct" if direct else "buffered",
        *(r / 1e9 for r in rates.values()),
        nbytes // MIB,
    )
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="the spill directory")
    parser.add_argument("--mib", type=int, default=256, help="the probe file's size")
    args = parser.parse_args()
    json.dump(disk_bandwidth(args.dir, args.mib * MIB), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
