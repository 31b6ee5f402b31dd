"""The `wstrain` CLI in the test process: no interpreter start-up (about 1 s each under load),
so a test can run it dozens of times."""

from __future__ import annotations

import pytest

from wstrain.cli.main import main


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The CLI in this process (no interpreter start-up): exit code, stdout, stderr."""
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse and spec errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
