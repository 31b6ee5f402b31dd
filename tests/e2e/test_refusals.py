"""A policy refusal fails its job at once, end to end on real Redis, a real API, a real
agent and real workers. Jobs whose files were swapped, after the API accepted them, for
links into the state dir or out of the data roots end `failed` on their first attempt with
no automatic retry (a crash would be retried, up to max_retries), the error naming the
field and nothing of the file it pointed at:

- the data file: the worker refuses it (WorkerExit.refused), the job never retries;
- a model dir's config.json, a token file's document index: the agent reads these to plan
  the job, by descriptor under the roots, and fails it there (a FIFO blocks nothing).

    pytest -m slow tests/e2e/test_refusals.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import CORPUS, REPO, make_stack, tiny_spec, wait_terminal
from wstrain.contracts.model_dims import PRESETS
from wstrain.prepare.pipeline import PrepareRequest, prepare

pytestmark = pytest.mark.slow

MARKER = "WSTRAIN-REFUSAL-MARKER-41c9"
WORKER = ["queued", "planning", "running", "failed"]  # refused by the worker
AGENT = ["queued", "planning", "failed"]  # refused while the agent plans


def _swap(path: Path, target: Path) -> None:
    """`path` becomes a symlink to `target`: after the API checked it, before it is read."""
    path.unlink()
    path.symlink_to(target)


def test_files_swapped_into_the_state_dir_fail_their_jobs_at_once_without_retries(
    redis_url: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # no agent yet: the jobs wait in the queue while their files are swapped; a 1 s back-off
    # so that a retry, were there one, would show within the test
    stack = make_stack(
        redis_url, tmp_path, "refusal", with_agent=False, extra_env={"WSTRAIN_RETRY_BACKOFF_S": "1"}
    )
    agent = None
    try:
        secret = stack.state_dir / "secret.txt"
        secret.parent.mkdir(parents=True, exist_ok=True)
        secret.write_text(f"{MARKER} another job's secrets\n" * 500)
        (stack.state_dir / "config.json").write_text(json.dumps({"note": MARKER}))
        os.mkfifo(stack.state_dir / "pipe.idx")
        elsewhere = tmp_path_factory.mktemp("elsewhere") / "outside.txt"  # under no root
        elsewhere.write_text(f"{MARKER} outside the roots\n" * 500)
        # a model dir and a prepared token file, valid when submitted
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(PRESETS["micro-llama"].to_hf_config()))
        save_file({"lm_head.weight": torch.zeros(256, 32)}, str(model / "model.safetensors"))
        src = tmp_path / "docs.jsonl"
        src.write_text("".join(json.dumps({"text": "z" * 99}) + "\n" for _ in range(40)))
        prepare(PrepareRequest(str(src), str(tmp_path / "docs.bin")))
        # (what is swapped, for what, the words the error must hold, the states it goes through)
        cases: list[tuple[dict[str, Any], Path, Path, list[str], list[str]]] = []
        for i, (target, why) in enumerate(
            ((secret, "state dir"), (elsewhere, "outside the data roots"))
        ):
            data = tmp_path / f"data-{i}.txt"
            data.write_bytes(CORPUS.read_bytes())
            over = {"data": {"kind": "text", "path": str(data), "tokenizer": "byte"}}
            cases.append((over, data, target, ["data.path", why, "not retried"], WORKER))
        cases.append(
            (
                {"model": {"path": str(model)}},
                model / "config.json",
                stack.state_dir / "config.json",
                ["model.path", "config.json", "state dir"],
                AGENT,
            )
        )
        cases.append(
            (
                {
                    "data": {"kind": "tokens", "path": str(tmp_path / "docs.bin")},
                    "document_mask": True,
                },
                tmp_path / "docs.idx",
                stack.state_dir / "pipe.idx",
                ["data.path's index", "state dir"],
                AGENT,
            )
        )
        with stack.client() as c:
            jobs = []
            for i, (over, path, target, words, states) in enumerate(cases):
                r = c.post("/v1/jobs", json=tiny_spec(f"swapped-{i}", max_retries=2, **over))
                assert r.status_code == 201, r.text
                _swap(path, target)
                jobs.append((r.json()["id"], words, states))
            agent = subprocess.Popen(
                [sys.executable, "-m", "wstrain.agent.agent"], env=stack.env, cwd=REPO
            )
            for job_id, words, states in jobs:
                done = wait_terminal(c, job_id)
                assert done["state"] == "failed", done
                assert done["attempt"] == 1 and done["retries"] == 0, done
                assert all(w in done["error"] for w in words), (words, done["error"])
                assert MARKER not in done["error"]
                events = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()
                seen = [e["data"]["state"] for e in events if e["kind"] == "state"]
                assert seen == states, (words, seen)
                assert not any("retry" in e["message"] for e in events)
                assert all(MARKER not in e["message"] for e in events)
            # the agent is unharmed (the FIFO blocked nothing): the next job trains
            ok = c.post("/v1/jobs", json=tiny_spec("after", steps=5)).json()
            after = wait_terminal(c, ok["id"])
            assert after["state"] == "succeeded" and after["error"] is None, after
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(60)
        stack.stop()
