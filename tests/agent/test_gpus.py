"""The agent's GPU series from NVML: on a machine without a driver the collector exports
nothing (and never raises); on a GPU (marked `gpu`) every GPU is sampled, utilisation rises
under a real matmul loop and PCIe receive throughput under real host-to-device copies.

    pytest tests/agent/test_gpus.py
"""

from __future__ import annotations

import time

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from wstrain.agent.gpus import GpuCollector, sample


def test_without_a_driver_nothing_is_exported() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert sample() == []
    registry = CollectorRegistry()
    registry.register(GpuCollector("cpu-node"))
    text = generate_latest(registry).decode()
    assert "wstrain_gpu_utilization_ratio{" not in text  # HELP/TYPE only, no samples


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_gpu_is_sampled_and_load_shows() -> None:
    idle = sample()
    assert len(idle) == torch.cuda.device_count()
    g = idle[0]
    assert g.name and g.uuid.startswith("GPU-")
    assert g.memory_total_bytes is not None and g.memory_total_bytes > 1 << 30
    assert g.temperature_celsius is not None and 0 < g.temperature_celsius < 120
    assert g.power_watts is not None and g.power_watts > 0
    # NVML's utilisation is the share of its last sample period (1/6 s to 1 s) with a kernel
    # running: keep the GPU busy for 2 s, then read it while still busy
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    busy = []
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        for _ in range(20):
            a @ a
        busy.append(sample()[0].utilization_ratio)
    torch.cuda.synchronize()
    assert max(u for u in busy if u is not None) > 0.5, busy
    # PCIe: NVML samples throughput over 20 ms; 1 GiB pinned copies in a loop keep it busy
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device="cuda")
    rx = []
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        dev.copy_(host, non_blocking=True)
        rx.append(sample()[0].pcie_rx_bytes_per_s)
    torch.cuda.synchronize()
    assert max(r for r in rx if r is not None) > 1e9, rx  # > 1 GB/s host to device
    registry = CollectorRegistry()
    registry.register(GpuCollector("gpu-node"))
    text = generate_latest(registry).decode()
    for name in ("utilization_ratio", "memory_used_bytes", "power_watts", "temperature_celsius"):
        assert f'wstrain_gpu_{name}{{gpu="0",node="gpu-node"}}' in text, name
    assert 'wstrain_gpu_pcie_throughput_bytes_per_second{direction="rx",gpu="0"' in text
