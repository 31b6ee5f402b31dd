"""bench/held_floor.py on CPU: a held rate is the calls' FLOPs over the timed window after
the warm-up, with the SM clock and power nvidia-smi reports across it (a stand-in
nvidia-smi on PATH answers as the real one does), and none where nvidia-smi is absent."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from bench.held_floor import gpu_sample, held_rate

HOLD_S = 0.3


def _matmul() -> tuple[Callable[[], object], float]:
    a, b = torch.ones(64, 64), torch.ones(64, 64)
    return (lambda: a @ b), 2.0 * 64**3


def test_a_held_rate_counts_the_timed_windows_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: no clocks
    calls = 0

    def fn() -> None:
        nonlocal calls
        calls += 1

    held = held_rate(fn, 10.0, HOLD_S)
    assert held.seconds >= HOLD_S and 1 <= held.calls < calls  # the warm-up's are not counted
    assert held.flops_per_s == pytest.approx(held.calls * 10.0 / held.seconds)
    assert held.sm_mhz is None and held.power_w is None
    with pytest.raises(ValueError, match="hold_s=0"):
        held_rate(fn, 10.0, 0)


def _nvidia_smi(monkeypatch: pytest.MonkeyPatch, folder: Path, script: str) -> None:
    """A stand-in nvidia-smi running `script` (sh), first on PATH."""
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{script}\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def test_the_clock_and_power_are_nvidia_smis_median(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what `nvidia-smi -i 0 --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits`
    # prints on the lent H200 under load
    _nvidia_smi(monkeypatch, tmp_path, "echo '1515, 690.42'")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_sample() == (1515.0, 690.42)
    fn, flops = _matmul()
    held = held_rate(fn, flops, HOLD_S)
    assert (held.sm_mhz, held.power_w) == (1515.0, 690.42)
    assert held.flops_per_s > 0


def test_a_broken_nvidia_smi_gives_no_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nvidia_smi(monkeypatch, tmp_path, "echo 'No devices were found'; exit 6")
    assert gpu_sample() is None


def test_the_sample_is_of_the_card_cuda_visible_devices_names_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvidia-smi numbers every card of the machine: a row run with CUDA_VISIBLE_DEVICES=1
    reads card 1, not card 0 (this stand-in answers with the -i it was given as the clock)."""
    _nvidia_smi(monkeypatch, tmp_path, 'echo "$2, 600"')
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert gpu_sample() == (1.0, 600.0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_sample() == (0.0, 600.0)
