"""The `wstrain` CLI from tests: in the test process (no interpreter start-up, about 1 s each
under load, so a test can run it dozens of times), or as its own process where the test is
about what a user's shell sees (exit code, both streams, the environment it reads)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wstrain.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The CLI in this process (no interpreter start-up): exit code, stdout, stderr."""
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse and spec errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def cli_process(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """`wstrain ARGS` as its own process from the repo root, with this environment plus `env`."""
    return subprocess.run(
        [sys.executable, "-m", "wstrain.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=timeout_s,
    )
