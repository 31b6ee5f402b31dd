"""Every failed submission check of a spec at once: an unknown preset, a missing data file
and a budget no node holds come back in one 422, one entry per field in the shape of schema
errors (loc, msg, type, input), and `wstrain submit` prints all three, so a newcomer fixes
the file once. A check that needs another's result is skipped when that one failed; one
failure answers as it always did. Real uvicorn and Redis (tests/conftest.py's api_only).

    pytest tests/api/test_validation_all.py
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.conftest import Stack, tiny_spec
from tests.helpers.cli import cli_process
from wstrain.api.validation import validate_and_plan
from wstrain.contracts.access import DataAccess
from wstrain.contracts.errors import InfeasibleBudget, InvalidSpec, SpecErrors
from wstrain.contracts.jobs import Node
from wstrain.contracts.spec import JobSpec

NODE_GIB = 16  # api_only's registered CPU node (tests/conftest.py register_node)
THREE_FIELDS = ["budget", "data.path", "model.preset"]


def three_faults(root: Path, name: str = "three-faults") -> dict[str, Any]:
    """An unknown preset, a data file that does not exist (under a data root) and a device
    budget four times the only node's memory."""
    return tiny_spec(
        name,
        model={"preset": "no-such-preset"},
        data={"kind": "text", "path": str(root / "missing.txt"), "tokenizer": "byte"},
        budget={"device_gib": 4 * NODE_GIB, "host_gib": 2},
    )


def cpu_node(gib: int = NODE_GIB) -> Node:
    return Node(
        name="cpu-node",
        device="cpu",
        gpus=[],
        host_total_bytes=gib << 30,
        host_free_bytes=gib << 30,
        slots=2,
        running=[],
        profile={},
        heartbeat_at=0.0,
    )


def fields_of(exc: SpecErrors) -> list[str]:
    return sorted(str(e.detail["field"]) for e in exc.errors)


def test_the_three_independent_failures_are_raised_together(tmp_path: Path) -> None:
    access = DataAccess.of([tmp_path], None)
    with pytest.raises(SpecErrors) as caught:
        validate_and_plan(JobSpec.model_validate(three_faults(tmp_path)), [cpu_node()], access)
    assert fields_of(caught.value) == THREE_FIELDS
    by_field = {e.detail["field"]: e.message for e in caught.value.errors}
    assert "'no-such-preset' is unknown" in by_field["model.preset"]
    assert "micro-llama" in by_field["model.preset"]  # the known presets, to choose from
    assert "missing.txt" in by_field["data.path"] and "does not exist" in by_field["data.path"]
    assert "lower the budgets" in by_field["budget"]
    assert caught.value.inputs == [
        "no-such-preset",
        str(tmp_path / "missing.txt"),
        {"device_gib": 4.0 * NODE_GIB, "host_gib": 2.0},
    ]
    # the planner process sends it to the API pickled: every failure must cross
    back = pickle.loads(pickle.dumps(caught.value))
    assert fields_of(back) == THREE_FIELDS and back.inputs == caught.value.inputs
    assert back.status == 422 and isinstance(back, InvalidSpec)


def test_planning_runs_beside_a_bad_data_file_and_adds_its_minimum_budget(
    tmp_path: Path,
) -> None:
    """Planning needs the model and a node, not the data file: a budget too small for the
    model is reported with the missing file, and its min_budget rides along."""
    spec = tiny_spec(
        "small-budget",
        model={"preset": "llama3-8b"},
        data={"kind": "text", "path": str(tmp_path / "missing.txt"), "tokenizer": "byte"},
        budget={"device_gib": 0.01, "host_gib": 0.01},
    )
    with pytest.raises(SpecErrors) as caught:
        validate_and_plan(JobSpec.model_validate(spec), [], DataAccess.of([tmp_path], None))
    assert fields_of(caught.value) == ["budget", "data.path"]
    assert any(isinstance(e, InfeasibleBudget) for e in caught.value.errors)
    assert set(caught.value.detail["min_budget"]) == {"device_gib", "host_gib"}  # type: ignore[arg-type]


def test_a_check_whose_input_failed_is_skipped(tmp_path: Path) -> None:
    """Token ids past the vocabulary can only be judged against a model: with an unknown
    preset the file's ids are not checked (nor planned), and the one failure is the
    preset, raised as itself."""
    tokens = tmp_path / "ids.npy"
    np.save(tokens, np.full(64, 60000, dtype=np.uint16))  # past micro-llama's 256 ids
    spec = tiny_spec(
        "vocab", model={"preset": "no-such-preset"}, data={"kind": "tokens", "path": str(tokens)}
    )
    access = DataAccess.of([tmp_path], None)
    with pytest.raises(InvalidSpec) as caught:
        validate_and_plan(JobSpec.model_validate(spec), [], access)
    assert not isinstance(caught.value, SpecErrors)
    assert caught.value.detail["field"] == "model.preset"
    # with a model, the same file's ids are what fails
    spec["model"] = {"preset": "micro-llama"}
    with pytest.raises(InvalidSpec, match="at or above the model's vocab_size") as caught:
        validate_and_plan(JobSpec.model_validate(spec), [], access)
    assert caught.value.detail["field"] == "data.path"


def _data_root(stack: Stack) -> Path:
    """A directory under api_only's data roots (its tmp dir), outside its state dir."""
    return stack.state_dir.parent


@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/plans"])
def test_one_answer_names_all_three_fields(api_only: Stack, route: str) -> None:
    spec = three_faults(_data_root(api_only), f"three-{route.rsplit('/', 1)[1]}")
    with api_only.client() as c:
        r = c.post(route, json=spec)
        assert r.status_code == 422, r.text
        errors = r.json()["detail"]
        assert sorted(".".join(e["loc"][1:]) for e in errors) == THREE_FIELDS, r.text
        for e in errors:  # the shape of a schema error, so clients read both alike
            assert set(e) == {"loc", "msg", "type", "input"} and e["loc"][0] == "body"
            assert e["type"] == "invalid_spec"
        by_field = {".".join(e["loc"][1:]): e for e in errors}
        assert by_field["model.preset"]["input"] == "'no-such-preset'"
        assert "choose one of" in by_field["model.preset"]["msg"]
        assert "missing.txt" in by_field["data.path"]["input"]
        assert "lower the budgets" in by_field["budget"]["msg"]
        listed = c.get("/v1/jobs").json()["jobs"]
        assert spec["name"] not in {j["spec"]["name"] for j in listed}  # nothing queued


def test_a_single_failure_answers_as_before_naming_its_field(api_only: Stack) -> None:
    spec = tiny_spec("one-fault", model={"preset": "no-such-preset"})
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=spec)
    assert r.status_code == 422, r.text
    body = r.json()
    assert isinstance(body["detail"], str) and "choose one of" in body["detail"]
    assert body["field"] == "model.preset"


def test_no_answer_quotes_the_files_it_refused(api_only: Stack) -> None:
    """Several failures at once still never quote a file: a tokenizer and a token file
    holding a marker, both refused, beside an unknown preset."""
    root = _data_root(api_only)
    marker = "MARKER-SEVERAL-7d1e"
    (root / "several.bin").write_bytes((marker * 3).encode())  # 57 bytes: not whole uint32s
    (root / "several-tok.json").write_text('{"model": {"' + marker + '": 1}}')
    spec = tiny_spec(
        "several-files",
        model={"preset": "no-such-preset"},
        data={"kind": "tokens", "path": str(root / "several.bin")},
    )
    text = tiny_spec(
        "several-text",
        model={"preset": "no-such-preset"},
        data={
            "kind": "text",
            "path": str(root / "several.bin"),
            "tokenizer": str(root / "several-tok.json"),
        },
    )
    with api_only.client() as c:
        for body in (spec, text):
            r = c.post("/v1/plans", json=body)
            assert r.status_code == 422 and isinstance(r.json()["detail"], list), r.text
            assert marker not in r.text and "SEVERAL" not in r.text, r.text


def test_submit_prints_all_three(api_only: Stack, tmp_path: Path) -> None:
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(three_faults(_data_root(api_only), "three-cli")))
    out = cli_process("submit", str(path), env={"WSTRAIN_URL": api_only.url}, timeout_s=60)
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("wstrain: 422: 3 errors:\n"), out.stderr
    lines = out.stderr.splitlines()[1:]
    assert sorted(line.strip().split(":", 1)[0] for line in lines) == THREE_FIELDS, out.stderr
    assert "no-such-preset" in out.stderr and "missing.txt" in out.stderr
