"""bench/host_fill.py on CPU (nothing page-locked): every method fills the bytes asked in
whole tiles, the parallel touch writes the first byte of every page and nothing else, and
an unknown method is refused by name."""

from __future__ import annotations

import json
import mmap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from bench.host_fill import METHODS, _touch, main


@pytest.mark.parametrize("threads", [1, 3])
def test_touch_writes_one_byte_in_every_page(threads: int) -> None:
    t = torch.ones(7 * mmap.PAGESIZE, dtype=torch.uint8)  # 7 pages: 3 threads split unevenly
    with ThreadPoolExecutor(threads) as pool:
        _touch(t, pool, threads)
    pages = t.view(7, mmap.PAGESIZE)
    assert pages[:, 0].tolist() == [0] * 7
    assert bool((pages[:, 1:] == 1).all())


def test_every_method_fills_the_bytes_asked(tmp_path: Path) -> None:
    out = tmp_path / "fill.json"
    main(["--gib", "0.25", "--threads", "2", "--repeats", "1", "--out", str(out)])
    run = json.loads(out.read_text())
    assert [r["method"] for r in run["rows"]] == list(METHODS)
    for r in run["rows"]:
        assert r["gib"] == 0.25 and r["seconds"] > 0
        assert r["gib_per_s"] == pytest.approx(r["gib"] / r["seconds"])
    assert set(run["thp"]) == {"enabled", "defrag"} and run["threads"] == 2


def test_an_unknown_method_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--methods", "arena,mlock"])
    assert "--methods: unknown ['mlock']" in capsys.readouterr().err
