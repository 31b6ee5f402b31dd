"""`--device-gib` / `--host-gib` on submit and plan: a number or a range MIN:MAX into the
spec's budget, a bad value an error naming the flag (exit 2); a YAML range reaches the
server as written; `wstrain plan` prints a ranged budget's points with tokens/s.

    pytest tests/cli/test_budget_flags.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Stack, tiny_spec
from tests.helpers.cli import run_main
from wstrain.cli.main import build_parser
from wstrain.cli.spec import load_spec, with_budget


def test_a_number_or_a_range_parses_into_the_budget() -> None:
    args = build_parser().parse_args(
        ["plan", "s.yaml", "--device-gib", "12:40", "--host-gib", "64"]
    )
    assert (args.device_gib, args.host_gib) == ({"min": 12.0, "max": 40.0}, 64.0)
    spec = {"budget": {"device_gib": 1, "host_gib": 2, "chosen": {"device_gib": 1, "host_gib": 2}}}
    assert with_budget(spec, args.device_gib, None) == {
        "budget": {"device_gib": {"min": 12.0, "max": 40.0}, "host_gib": 2}
    }
    assert with_budget(spec, None, None) is spec


def test_disk_gib_sets_the_disk_budget_beside_the_others() -> None:
    args = build_parser().parse_args(["submit", "s.yaml", "--disk-gib", "128"])
    spec = {"budget": {"device_gib": 24, "host_gib": 180}}
    assert with_budget(spec, args.device_gib, args.host_gib, args.disk_gib) == {
        "budget": {"device_gib": 24, "host_gib": 180, "disk_gib": 128.0}
    }


@pytest.mark.parametrize(
    ("value", "says"),
    [("40:12", "min 40 is above max 12"), ("a:b", "not a number of GiB"), ("0", "above 0")],
)
def test_a_bad_value_is_an_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str], value: str, says: str
) -> None:
    code, _, err = run_main(capsys, "submit", "s.yaml", "--device-gib", value)
    assert code == 2
    assert "--device-gib" in err and says in err


def test_a_yaml_range_is_read_as_written(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: r\nbudget: {device_gib: {min: 12, max: 40}, host_gib: 16}\n")
    assert load_spec(str(path))["budget"] == {"device_gib": {"min": 12, "max": 40}, "host_gib": 16}


def test_plan_prints_the_ranges_points(
    api_only: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(tiny_spec("ranged-cli")))
    code, out, err = run_main(
        capsys, "--server", api_only.url, "plan", str(path), "--device-gib", "1:40"
    )
    assert code == 0, err
    assert "device/host   14 / 2 GiB" in out  # what the 16 GiB CPU node holds beside 2
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "tokens/s" in line)
    rows = lines[header + 1 : header + 6]
    assert [r.split()[0] for r in rows] == ["1", "10.75", "20.5", "30.25", "40"]
    assert "more than the node" in rows[-1]
