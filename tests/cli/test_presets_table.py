"""`wstrain presets` prints every size readably: the tiny presets' counts in K or
M and their state in MiB, not `0.001B ... 0.0 GiB`; the 8B presets as before. The table is
read from a real uvicorn over real Redis; the units' edges from the formatters.

    pytest tests/cli/test_presets_table.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, Stack
from wstrain.cli.tables import bytes_text, count_text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (999, "999"),
        (1000, "1.0K"),
        (853_120, "853.1K"),
        (1_150_000, "1.1M"),
        (999_949_999, "999.9M"),
        (8_030_261_248, "8.030B"),
    ],
)
def test_counts_take_the_largest_unit_they_reach(n: int, text: str) -> None:
    assert count_text(n) == text


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [
        (512, "512 B"),
        (1024, "1.0 KiB"),
        (6_825_000, "6.5 MiB"),
        (1 << 30, "1.0 GiB"),
        (64_212_000_000, "59.8 GiB"),
    ],
)
def test_bytes_take_the_largest_binary_unit_they_reach(n_bytes: int, text: str) -> None:
    assert bytes_text(n_bytes) == text


def test_presets_shows_tiny_models_in_k_and_mib(api_only: Stack) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "wstrain.cli.main", "presets"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "WSTRAIN_URL": api_only.url},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:]}
    assert "0.001B" not in out.stdout and " 0.0 GiB" not in out.stdout
    # tiny-llama: 4 layers of d=128 over 256 bytes, 0.85 M parameters, 6.5 MiB of bf16 state
    assert re.search(r"\s\d{3}\.\dK\s+\d{3}\.\dK\s+\d+\.\d MiB$", rows["tiny-llama"])
    assert re.search(r"\s8\.030B\s+8\.030B\s+59\.8 GiB$", rows["llama3-8b"])
