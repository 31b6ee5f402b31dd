"""What a job may read: under the data roots, never the state dir, checked on submit by path
and in the worker on the file actually opened, so a symlink swapped in later leads nowhere.

    pytest tests/scheduler/contracts/test_access.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wstrain.scheduler.contracts.access import DataAccess
from wstrain.scheduler.contracts.errors import InvalidSpec
from wstrain.scheduler.settings import SharedSettings


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
