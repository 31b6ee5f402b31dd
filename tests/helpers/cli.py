"""The `wstrain` CLI from tests: in the test process (no interpreter start-up, about 1 s each
under load, so a test can run it dozens of times), or as its own process where the test is
about what a user's shell sees (exit code, both streams, the environment it reads)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
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


@contextlib.contextmanager
def as_a_foreground_job() -> Iterator[None]:
    """Processes started in this block get SIGINT as an interactive shell gives its
    foreground job: at its default and unblocked, so Ctrl-C is a KeyboardInterrupt. A child
    keeps an ignored or blocked SIGINT across exec, and Python leaves an inherited SIG_IGN in
    place, so a test worker that something left that way (reproduced by ignoring SIGINT in
    the test process: the CLI then never sees Ctrl-C) would hang a Ctrl-C test."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, old if old is not None else signal.SIG_DFL)
