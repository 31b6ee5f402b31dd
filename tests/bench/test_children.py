"""bench/children.py with real child processes: a row is the last line a child prints, a
failed child's row carries its identity and last stderr line, and the rows land in --out
after each child.

    pytest tests/bench/test_children.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.children import run_child, run_children

ROW_THEN_EXIT = """import sys
print("noise")
print('{"name": "%s", "tokens_per_s": 2.0}')
print("last words", file=sys.stderr)
sys.exit(%d)
"""


def test_a_childs_row_is_its_last_stdout_line() -> None:
    code = ROW_THEN_EXIT % ("a", 0)
    row, last = run_child([sys.executable, "-c", code], {})
    assert row == {"name": "a", "tokens_per_s": 2.0} and last == "last words"


def test_a_failed_child_keeps_its_identity_and_last_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fine_row.py").write_text(ROW_THEN_EXIT % ("a", 0))
    (tmp_path / "failed_row.py").write_text(ROW_THEN_EXIT % ("b", 1))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the children find their modules here
    out = tmp_path / "rows.json"
    rows = run_children(
        [(["fine_row"], {"name": "a"}), (["failed_row"], {"name": "b", "global_batch": 8})],
        str(out),
    )
    assert rows == [
        {"name": "a", "tokens_per_s": 2.0},
        {"name": "b", "global_batch": 8, "error": "last words"},
    ]
    assert json.loads(out.read_text()) == rows
