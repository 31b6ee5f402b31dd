"""What one training step reports, for every runtime (resident and working set)."""

from __future__ import annotations

from dataclasses import dataclass, field

from wstrain.contracts.metrics import STALL_REASONS


@dataclass
class StepStats:
    loss: float
    step_seconds: float
    tokens: int
    stall_s: dict[str, float] = field(default_factory=dict)  # compute waiting, by dependency
    h2d_bytes: int = 0
    d2h_bytes: int = 0


def proc_status_bytes(field: str = "VmRSS") -> int:
    """A memory field of /proc/self/status ("VmRSS" now, "VmHWM" peak) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class Telemetry:
    """Running totals a worker reports with each step message (its reports are throttled,
    so counters must be cumulative here, not per reported step). Keys: `name` or
    `name.label`, as the agent's /metrics exports them (agent/exporter.py)."""

    stall_s: dict[str, float] = field(default_factory=dict)
    h2d_bytes: int = 0
    d2h_bytes: int = 0

    def add(self, stats: StepStats) -> None:
        for dep, s in stats.stall_s.items():
            self.stall_s[dep] = self.stall_s.get(dep, 0.0) + s
        self.h2d_bytes += stats.h2d_bytes
        self.d2h_bytes += stats.d2h_bytes

    def snapshot(
        self,
        last: StepStats,
        arena_bytes: int,
        pinned_bytes: int,
        device_peak: tuple[int, int] | None,
    ) -> dict[str, float]:
        # every reason from the first report, 0 where this runtime never waits on it (the
        # resident runtime waits on none), so a dashboard's rate() has a series at once
        out = {f"stall_seconds_total.{r}": 0.0 for r in STALL_REASONS}
        out.update({f"stall_seconds_total.{d}": s for d, s in self.stall_s.items()})
        out.update(
            {
                "transfer_bytes_total.h2d": float(self.h2d_bytes),
                "transfer_bytes_total.d2h": float(self.d2h_bytes),
                "transfer_bandwidth.h2d": last.h2d_bytes / last.step_seconds,
                "transfer_bandwidth.d2h": last.d2h_bytes / last.step_seconds,
                "host_rss_bytes": float(proc_status_bytes()),
                "host_arena_bytes": float(arena_bytes),
                "host_pinned_bytes": float(pinned_bytes),
            }
        )
        if device_peak is not None:
            out["device_memory_bytes.allocated"] = float(device_peak[0])
            out["device_memory_bytes.reserved"] = float(device_peak[1])
        else:  # on a CPU node the device is host memory: the process's peak is its footprint
            out["device_memory_bytes.process_rss"] = float(proc_status_bytes("VmHWM"))
        return out
