"""working_set/rings.py Streams: a host wait is a stall only as far as the compute stream runs
dry during it (CUDA), and the host's wall time on CPU, where nothing runs behind the host.

    pytest tests/working_set/test_rings.py
"""

from __future__ import annotations

import time

import pytest
import torch

from wstrain.worker.runtime.working_set.rings import Streams

HOST_WAIT_S = 0.05


def test_host_wait_on_cpu_is_the_hosts_time() -> None:
    streams = Streams(torch.device("cpu"))
    with streams.host_waits("write_buffer"):
        time.sleep(HOST_WAIT_S)
    assert streams.collect_stalls()["write_buffer"] >= HOST_WAIT_S


def _gpu_busy_for(seconds: float) -> None:
    """Queue a kernel that spins about `seconds` on the current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    cycles_per_s = 1_000_000 / (start.elapsed_time(end) / 1e3)
    torch.cuda._sleep(int(seconds * cycles_per_s))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_host_wait_counts_only_the_compute_streams_idle() -> None:
    streams = Streams(torch.device("cuda"))
    torch.cuda.synchronize()
    with streams.host_waits("optimizer"):  # nothing queued: the GPU idles throughout
        time.sleep(HOST_WAIT_S)
    idle_s = streams.collect_stalls()["optimizer"]
    assert 0.8 * HOST_WAIT_S < idle_s < 2 * HOST_WAIT_S
    # the queue outlasts the host's wait by far: no idle (at 4x, a GPU that clocked up after
    # the calibrating spin ran dry 41 ms into a 50 ms wait on an H100)
    _gpu_busy_for(20 * HOST_WAIT_S)
    with streams.host_waits("optimizer"):
        time.sleep(HOST_WAIT_S)
    assert streams.collect_stalls()["optimizer"] < 0.1 * HOST_WAIT_S
