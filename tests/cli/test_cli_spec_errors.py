"""Every schema error of a spec at once: a spec with bad fields and bad
combinations of fields gets all of them in one 422, and `wstrain submit` prints every one,
so a newcomer fixes the file once instead of once per error. Real uvicorn, real Redis.

    pytest tests/cli/test_cli_spec_errors.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from tests.conftest import Stack, tiny_spec
from tests.helpers.cli import cli_process
from wstrain.contracts.spec import JobSpec


def bad_spec() -> dict[str, object]:
    """Seven mistakes: three bad fields, an unknown key, a batch the ranks do not divide,
    fp8 activations under fp32, a device optimizer for a data-parallel job."""
    spec = tiny_spec("many-errors", seq_len=-5, steps="abc", precision="fp32", gpus=2)
    spec.update(
        global_batch=4,
        nodes=3,
        step=300,
        activation_precision="fp8",
        optimizer={"lr": -1.0},
        overrides={"optimizer": "device"},
    )
    return spec


EXPECTED = [
    "seq_len: Input should be greater than 0",
    "steps: Input should be a valid integer",
    "optimizer.lr: Input should be greater than 0",
    "step: Extra inputs are not permitted",
    "nodes: Value error, nodes=3 x gpus=2 must divide global_batch=4",
    'activation_precision: Value error, activation_precision="fp8" stores 16-bit',
    'overrides: Value error, gpus=2 with overrides.optimizer="device"',
]


def test_the_schema_reports_field_and_cross_field_errors_together() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(bad_spec())
    where = sorted(".".join(str(p) for p in e["loc"]) for e in exc.value.errors())
    assert where == sorted(
        ["seq_len", "steps", "optimizer.lr", "step", "nodes", "activation_precision", "overrides"]
    )


def test_submit_prints_every_schema_error_of_the_spec(api_only: Stack, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad_spec()))
    out = cli_process("submit", str(path), env={"WSTRAIN_URL": api_only.url}, timeout_s=60)
    assert out.returncode == 1
    assert out.stderr.startswith("wstrain: 422: ")
    for words in EXPECTED:
        assert words in out.stderr, (words, out.stderr)
