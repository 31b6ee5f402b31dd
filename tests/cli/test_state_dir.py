"""`wstrain serve --state-dir X` guards X in every process, on a real `wstrain serve` (its API,
agent and workers) over a real Redis: the agent writes the jobs into X, and every path into
X is refused on submit with a 422 naming the field, without the API reading it.

"Not read" is proved two ways. Fields point at FIFOs planted in X: an open() of one blocks
until a writer comes, so an API that opened it would hang the request past the planning
deadline, and afterwards a writer's non-blocking open finds a reader still waiting (ENXIO
means none). And the regular files planted in X hold marker strings that no response may
carry.

The settings `wstrain serve` builds, and the environment it hands its agent, are checked
alone too (fast).

    pytest tests/cli/test_state_dir.py     # -m slow: the one on a real `wstrain serve`
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CORPUS, REPO, _wait_http, seed_node_profile, tiny_spec, wait_terminal
from wstrain.cli.serve import settings_for
from wstrain.prepare.pipeline import PrepareRequest, prepare
from wstrain.settings import SharedSettings

MARKER = "WSTRAIN-STATE-MARKER-7f3a"
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}


@pytest.fixture(scope="module")
def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real `wstrain serve --state-dir X`, run from a directory of its own (so the old
    default, ./wstrain-state, is somewhere else), on the session's Redis."""
    from tests.ports import free_port

    tmp = tmp_path_factory.mktemp("statedir")
    state, cwd = tmp / "state", tmp / "cwd"
    cwd.mkdir()
    seed_node_profile(state)  # the profile this test process measured: its agent reads it
    env = {k: v for k, v in os.environ.items() if not k.startswith("WSTRAIN_")}
    env.update(
        WSTRAIN_REDIS_URL=redis_url,
        WSTRAIN_KEY_PREFIX="statedir",
        WSTRAIN_API_TOKENS=json.dumps({"tok-alice": "alice", "tok-bob": "bob"}),
        WSTRAIN_CPU_SLOTS="1",
        WSTRAIN_WORKER_THREADS="1",
        WSTRAIN_NODE_NAME="node-statedir",
        # a root that holds the state dir: only the state dir's own exclusion guards it
        WSTRAIN_DATA_ROOTS=json.dumps([str(REPO), str(tmp)]),
        WSTRAIN_HEARTBEAT_S="0.5",
        PYTHONPATH=str(REPO),
    )
    port = free_port()
    cmd = [sys.executable, "-m", "wstrain.cli.main", "serve", "--port", str(port)]
    cmd += ["--state-dir", str(state), "--metrics-port", str(free_port())]
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/healthz", proc, timeout_s=60)
        yield {"url": url, "state": state, "tmp": tmp, "cwd": cwd}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(120)


def _plant(state: Path, tmp: Path, ckpt: Path) -> dict[str, Path]:
    """FIFOs and marker files in the state dir, and files outside it that lead into it."""
    planted = state / "planted"
    planted.mkdir()
    paths: dict[str, Path] = {}
    for name in ("pipe.txt", "pipe.bin", "pipe.idx", "tokenizer.json"):
        os.mkfifo(planted / name)
        paths[name] = planted / name
    (planted / "secret.txt").write_text(f"{MARKER} a line of text\n" * 200)
    model = planted / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "note": MARKER}))
    (model / "model.safetensors").write_bytes(MARKER.encode() * 100)
    # outside the state dir, under a data root: symlinks into it, and a prepared token file
    # whose header and index are symlinks into it
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "text.txt").symlink_to(planted / "secret.txt")
    (outside / "model").symlink_to(model)
    # a model dir of its own, real weights, but its config.json a link into the state dir
    (outside / "model-cfg").mkdir()
    shutil.copy(ckpt / "model.safetensors", outside / "model-cfg")
    (outside / "model-cfg" / "config.json").symlink_to(model / "config.json")
    src = outside / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": "z" * 99}) + "\n" for _ in range(40)))
    prepare(PrepareRequest(str(src), str(outside / "docs.bin")))
    header = json.loads((outside / "docs.json").read_text())
    (planted / "docs.json").write_text(json.dumps({**header, "tokenizer": MARKER}))
    for name in ("hdr", "idx"):  # two copies of the .bin, one for each side file's case
        (outside / f"{name}.bin").write_bytes((outside / "docs.bin").read_bytes())
    (outside / "hdr.json").symlink_to(planted / "docs.json")
    (outside / "idx.json").write_text((outside / "docs.json").read_text())
    (outside / "idx.idx").symlink_to(planted / "pipe.idx")
    paths.update(planted=planted, outside=outside)
    return paths


def _no_reader(fifo: Path) -> bool:
    """True when nobody holds `fifo` open for reading or waits in open() to: a writer's
    non-blocking open then fails with ENXIO."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        return exc.errno == errno.ENXIO
    os.close(fd)  # a reader was there; closing releases it with EOF
    return False


def test_serve_builds_one_settings_object_that_its_children_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")  # a root given through a symlink
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WSTRAIN_STATE_DIR", "from-env")
    monkeypatch.setenv("WSTRAIN_DATA_ROOTS", json.dumps(["link"]))
    assert settings_for(None).state_dir == tmp_path / "from-env"  # absolute, from the env
    ours = settings_for(Path("from-flag"))  # --state-dir wins over WSTRAIN_STATE_DIR
    assert ours.state_dir == tmp_path / "from-flag"
    assert ours.data_roots == [str(tmp_path / "data")]  # resolved once, for every process
    # the agent child sees only the environment it is given: the same state dir and roots,
    # whatever its own working directory
    env = ours.child_env()
    for name in env:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.chdir("/")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = SharedSettings()
    assert child.access() == ours.access()
    assert child.model_dump() == SharedSettings.model_validate(ours.model_dump()).model_dump()


def test_serve_refuses_a_data_root_inside_its_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WSTRAIN_DATA_ROOTS", json.dumps([str(tmp_path / "state" / "jobs")]))
    with pytest.raises(SystemExit, match="inside it"):
        settings_for(tmp_path / "state")


@pytest.mark.slow
def test_serve_guards_its_state_dir_in_the_api_agent_and_workers(
    served: dict[str, Any],
) -> None:
    state: Path = served["state"]
    with httpx.Client(base_url=served["url"], timeout=60, headers=ALICE) as c:
        # the agent works in X: alice's job trains and checkpoints there
        job = c.post("/v1/jobs", json=tiny_spec("alice-ckpt", steps=6))
        assert job.status_code == 201, job.text
        done = wait_terminal(c, job.json()["id"], timeout_s=240)
        assert done["state"] == "succeeded", done["error"]
        ckpt = Path(done["last_checkpoint"])
        assert state.resolve() in ckpt.parents, ckpt
        assert not (served["cwd"] / "wstrain-state").exists()  # nobody used the old default
        p = _plant(state, served["tmp"], ckpt)
        text = {"kind": "text", "path": str(CORPUS), "tokenizer": "byte"}
        cases: list[tuple[str, dict[str, Any]]] = [
            ("model.path", {"model": {"path": str(ckpt)}}),  # another owner's checkpoint
            ("model.path", {"model": {"path": str(state)}}),  # X itself
            ("model.path", {"model": {"path": str(p["planted"] / "model")}}),
            ("model.path", {"model": {"path": str(p["outside"] / "model")}}),  # symlink in
            ("model.path", {"model": {"path": str(p["outside"] / "model-cfg")}}),
            ("data.path", {"data": {"kind": "tokens", "path": str(ckpt / "model.safetensors")}}),
            ("data.path", {"data": {"kind": "text", "path": str(state)}}),
            ("data.path", {"data": {"kind": "text", "path": str(p["pipe.txt"])}}),
            ("data.path", {"data": {"kind": "tokens", "path": str(p["pipe.bin"])}}),
            ("data.path", {"data": {"kind": "text", "path": str(p["outside"] / "text.txt")}}),
            ("data.path", {"data": {**text, "path": str(p["planted"] / "secret.txt")}}),
            ("data.tokenizer", {"data": {**text, "tokenizer": str(p["tokenizer.json"])}}),
            ("header", {"data": {"kind": "tokens", "path": str(p["outside"] / "hdr.bin")}}),
            (
                "index",
                {
                    "data": {"kind": "tokens", "path": str(p["outside"] / "idx.bin")},
                    "document_mask": True,
                },
            ),
        ]
        for field, over in cases:
            r = c.post("/v1/jobs", json=tiny_spec("into-x", **over), headers=BOB)
            assert r.status_code == 422, (field, over, r.status_code, r.text)
            assert field in r.text and "state dir" in r.text, (field, r.text)
            assert MARKER not in r.text, r.text
            plan = c.post("/v1/plans", json=tiny_spec("into-x", **over), headers=BOB)
            assert plan.status_code == 422 and field in plan.text, (field, plan.text)
            assert MARKER not in plan.text
        for name in ("pipe.txt", "pipe.bin", "pipe.idx", "tokenizer.json"):
            assert _no_reader(p[name]), f"the API opened the FIFO {name} in the state dir"
        # the refusals made no jobs: bob's list is empty, and nothing of X shows in it
        listed = c.get("/v1/jobs", headers=BOB)
        assert listed.status_code == 200 and MARKER not in listed.text
        assert listed.json()["jobs"] == []
