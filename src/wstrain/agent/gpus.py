"""The host's GPUs beside its jobs on the agent's /metrics: utilisation, memory, power,
temperature and PCIe throughput of every GPU, read from NVML (nvidia-ml-py) at scrape time.

The `gpu` label is NVML's index, which is PCI bus order; the agent starts workers with
CUDA_DEVICE_ORDER=PCI_BUS_ID so the index in a job's `wstrain_job_info{gpu}` is the same
device, and a dashboard joins the two on (node, gpu). Without a driver (a CPU node) NVML
does not initialise and the collector exports nothing. Registered by the agent:

    registry.register(GpuCollector("gpu-host-1"))
    python -m wstrain.agent.gpus        # prints this host's series once
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from wstrain.contracts import metrics as m

log = logging.getLogger(__name__)

_KIB = 1024  # NVML reports PCIe throughput in KB/s (its docs: KiB, sampled over 20 ms)
_MILLI = 1e-3  # and power in milliwatts


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    uuid: str
    utilization_ratio: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None
    temperature_celsius: float | None
    pcie_tx_bytes_per_s: float | None  # device to host
    pcie_rx_bytes_per_s: float | None  # host to device


def _read(fn: Callable[..., Any], *args: object) -> Any:
    """One NVML query; None where the device does not support it (e.g. power on some
    boards), so one missing field never hides the others."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def sample() -> list[GpuSample]:
    """Every GPU's figures now; [] without NVML or a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library or no driver: a CPU node
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            util = _read(pynvml.nvmlDeviceGetUtilizationRates, h)
            mem = _read(pynvml.nvmlDeviceGetMemoryInfo, h)
            power_mw = _read(pynvml.nvmlDeviceGetPowerUsage, h)
            temp = _read(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
            tx = _read(pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = _read(pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
            out.append(
                GpuSample(
                    index=i,
                    name=str(_read(pynvml.nvmlDeviceGetName, h) or ""),
                    uuid=str(_read(pynvml.nvmlDeviceGetUUID, h) or ""),
                    utilization_ratio=util.gpu / 100 if util is not None else None,
                    memory_used_bytes=mem.used if mem is not None else None,
                    memory_total_bytes=mem.total if mem is not None else None,
                    power_watts=power_mw * _MILLI if power_mw is not None else None,
                    temperature_celsius=temp if temp is not None else None,
                    pcie_tx_bytes_per_s=tx * _KIB if tx is not None else None,
                    pcie_rx_bytes_per_s=rx * _KIB if rx is not None else None,
                )
            )
        return out
    finally:
        pynvml.nvmlShutdown()


class GpuCollector(Collector):
    def __init__(self, node: str) -> None:
        self.node = node
        self._lock = threading.Lock()  # NVML init/shutdown are process-wide

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            gpus = sample()
        yield from families(self.node, gpus)


def families(node: str, gpus: list[GpuSample]) -> Iterator[GaugeMetricFamily]:
    def fam(metric: m.Metric) -> GaugeMetricFamily:
        return GaugeMetricFamily(metric.name, metric.help, labels=list(metric.labels))

    info = fam(m.GPU_INFO)
    gauges = {
        "utilization_ratio": fam(m.GPU_UTILIZATION),
        "memory_used_bytes": fam(m.GPU_MEMORY_USED),
        "memory_total_bytes": fam(m.GPU_MEMORY_TOTAL),
        "power_watts": fam(m.GPU_POWER),
        "temperature_celsius": fam(m.GPU_TEMPERATURE),
    }
    pcie = fam(m.GPU_PCIE)
    for g in gpus:
        idx = str(g.index)
        info.add_metric([node, idx, g.name, g.uuid], 1.0)
        for attr, f in gauges.items():
            value = getattr(g, attr)
            if value is not None:
                f.add_metric([node, idx], float(value))
        for direction, value in (("tx", g.pcie_tx_bytes_per_s), ("rx", g.pcie_rx_bytes_per_s)):
            if value is not None:
                pcie.add_metric([node, idx, direction], value)
    yield info
    yield from gauges.values()
    yield pcie


def main() -> None:
    registry = CollectorRegistry()
    registry.register(GpuCollector("this-host"))
    print(generate_latest(registry).decode(), end="")


if __name__ == "__main__":
    main()
