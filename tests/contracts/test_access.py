"""What a job may read: under the data roots, never the state dir, checked on submit by path
and in the worker on the file actually opened, so a symlink swapped in later leads nowhere.

    pytest tests/contracts/test_access.py
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
from pydantic import ValidationError

from wstrain.contracts.access import DataAccess
from wstrain.contracts.errors import InvalidSpec
from wstrain.settings import SharedSettings


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root, outside, state = tmp_path / "data", tmp_path / "secret", tmp_path / "data" / "state"
    for d in (root, outside, state / "jobs" / "other"):
        d.mkdir(parents=True)
    (root / "corpus.txt").write_text("mine")
    (outside / "key.txt").write_text("not yours")
    (state / "jobs" / "other" / "weights.bin").write_text("someone else's checkpoint")
    return {"root": root, "outside": outside, "state": state}


def test_paths_are_checked_against_roots_and_the_state_dir(tree: dict[str, Path]) -> None:
    access = DataAccess.of([tree["root"]], tree["state"])
    assert access.check(str(tree["root"] / "corpus.txt"), "data.path").name == "corpus.txt"
    with pytest.raises(InvalidSpec, match=r"data.path=.*lies outside the data roots"):
        access.check(str(tree["outside"] / "key.txt"), "data.path")
    with pytest.raises(InvalidSpec, match=r"model.path=.*inside the service's state dir"):
        access.check(str(tree["state"] / "jobs" / "other"), "model.path")
    (tree["root"] / "link").symlink_to(tree["outside"] / "key.txt")
    with pytest.raises(InvalidSpec, match="outside the data roots"):
        access.check(str(tree["root"] / "link"), "data.path")


def test_a_root_inside_the_state_dir_is_refused_at_start(
    tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WSTRAIN_STATE_DIR", str(tree["state"]))
    monkeypatch.setenv("WSTRAIN_DATA_ROOTS", f'["{tree["state"] / "jobs"}"]')
    with pytest.raises(ValueError, match=r"is the state dir .* or lies inside it"):
        SharedSettings()
    monkeypatch.setenv("WSTRAIN_DATA_ROOTS", f'["{tree["root"]}"]')  # it holds the state dir:
    assert SharedSettings().access().state_dir == tree["state"]  # fine, the dir itself is not


def test_the_worker_checks_the_file_it_opened_not_the_path(tree: dict[str, Path]) -> None:
    access = DataAccess.of([tree["root"]], tree["state"])
    data = tree["root"] / "corpus.txt"
    access.check(str(data), "data.path")  # passes on submit...
    data.unlink()
    data.symlink_to(tree["outside"] / "key.txt")  # ...then a link out is swapped in
    with pytest.raises(InvalidSpec, match="outside the data roots"), access.open(data, "data.path"):
        pytest.fail("opened a file outside the roots")
    data.unlink()
    data.symlink_to(tree["state"] / "jobs" / "other" / "weights.bin")  # or into the state dir
    with pytest.raises(InvalidSpec, match="state dir"), access.open(data, "data.path"):
        pytest.fail("opened another job's checkpoint")


def test_links_that_stay_inside_the_root_are_followed(tree: dict[str, Path]) -> None:
    """A Hugging Face cache links snapshots/<rev>/file to ../../blobs/<sha>: allowed."""
    blobs, snap = tree["root"] / "hub" / "blobs", tree["root"] / "hub" / "snapshots" / "r1"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / "abc").write_bytes(b"weights")
    (snap / "model.safetensors").symlink_to(Path("../../blobs/abc"))
    access = DataAccess.of([tree["root"]], tree["state"])
    with access.open(snap / "model.safetensors", "model.path") as path:
        with open(path, "rb") as f:
            assert f.read() == b"weights"
        # the yielded path names the opened file even if the link is swapped meanwhile
        (snap / "model.safetensors").unlink()
        (snap / "model.safetensors").symlink_to(tree["outside"] / "key.txt")
        with open(path, "rb") as f:
            assert f.read() == b"weights"
    assert os.path.islink(snap / "model.safetensors")


def test_a_file_over_its_cap_is_refused_from_its_size_alone(tree: dict[str, Path]) -> None:
    """read_bytes fstat()s the descriptor: a 2 GiB sparse file is refused at once, naming
    the field and the cap; a file at the cap is read whole."""
    access = DataAccess.of([tree["root"]], tree["state"])
    big = tree["root"] / "config.json"
    with open(big, "wb") as f:
        f.truncate(2 << 30)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidSpec, match=r"model.path's config.json=.* 2.0 GiB, over the "):
            access.read_bytes(big, "model.path's config.json", 1 << 20)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 1 << 20  # nothing of the 2 GiB was read into memory
    (tree["root"] / "small.json").write_bytes(b"x" * 100)
    assert access.read_bytes(tree["root"] / "small.json", "f", 100) == b"x" * 100
    with pytest.raises(InvalidSpec, match=r"cap \(99 bytes\)") as refused:
        access.read_bytes(tree["root"] / "small.json", "f", 99)
    assert refused.value.detail == {"max_bytes": 99}


def test_fifos_devices_and_directories_are_not_read(tree: dict[str, Path]) -> None:
    """A FIFO under a root would block a reader until some writer came: refused at once."""
    access = DataAccess.of([tree["root"]], tree["state"])
    os.mkfifo(tree["root"] / "pipe")
    with pytest.raises(InvalidSpec, match="not a regular file"):
        access.read_bytes(tree["root"] / "pipe", "data.tokenizer", 1 << 20)
    with pytest.raises(InvalidSpec, match="not a regular file"), access.open(tree["root"], "d"):
        pytest.fail("opened a directory as a file")
    with access.descriptor(tree["root"], "model.path", directory=True) as fd:
        assert "corpus.txt" in os.listdir(fd)
    (tree["root"] / "out").symlink_to(tree["outside"])
    linked_out = access.descriptor(tree["root"] / "out", "model.path", directory=True)
    with pytest.raises(InvalidSpec, match="outside the data roots"), linked_out:
        pytest.fail("opened a directory outside the roots")
    with pytest.raises(InvalidSpec, match=r"data.path='/nope' does not exist"):
        access.read_bytes("/nope", "data.path", 10)


def test_validation_errors_of_a_file_never_show_its_values() -> None:
    """file_problems names fields and rules: no input values, no keys of the file's own."""
    from wstrain.contracts.access import file_problems
    from wstrain.contracts.token_file import TokenFileHeader

    raw = {"dtype": "MARKER-1", "complete": "MARKER-2", "MARKER-3": 1, "tokens": -1}
    with pytest.raises(ValidationError) as caught:
        TokenFileHeader.model_validate(raw)
    text = file_problems(caught.value, 20)
    assert "MARKER" not in text, text
    assert "dtype: Input should be 'uint16' or 'uint32'" in text
    assert "a field the format does not have" in text and "vocab_size: Field required" in text
