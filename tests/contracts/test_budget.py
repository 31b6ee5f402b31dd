"""Budgets as ranges in the contract: a number or {min, max} per budget, min above max a
ValidationError naming the field and both values, the JSON a user sent round-tripping, a
fixed budget unchanged, and every reader's one point (device_gib/host_gib).

    pytest tests/contracts/test_budget.py
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.conftest import tiny_spec
from wstrain.contracts.budget import Budget, GibRange
from wstrain.contracts.calibration import GIB
from wstrain.contracts.spec import JobSpec

RANGED = {"device_gib": {"min": 12, "max": 40}, "host_gib": 16}


def test_a_range_parses_and_reads_as_its_max_until_chosen() -> None:
    b = Budget.model_validate(RANGED)
    assert b.ranged
    assert b.device == GibRange(min=12, max=40)
    assert b.device_range_gib == (12.0, 40.0) and b.host_range_gib == (16.0, 16.0)
    assert (b.device_gib, b.host_gib, b.device_bytes) == (40.0, 16.0, 40 * GIB)


def test_min_above_max_names_the_field_and_both_values() -> None:
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(
            tiny_spec("r", budget={"device_gib": {"min": 40, "max": 12}, "host_gib": 2})
        )
    (e,) = err.value.errors()
    assert e["loc"] == ("budget", "device_gib")
    assert "budget.device_gib" in e["msg"] and "min=40" in e["msg"] and "max=12" in e["msg"]


def test_a_bad_range_reports_only_the_range_form() -> None:
    with pytest.raises(ValidationError) as err:
        Budget.model_validate({"device_gib": {"min": 0, "max": 12}, "host_gib": 2})
    assert [e["loc"] for e in err.value.errors()] == [("device_gib", "range", "min")]


def test_the_json_sent_round_trips_and_a_fixed_budget_is_unchanged() -> None:
    ranged = JobSpec.model_validate(tiny_spec("r", budget=RANGED))
    assert JobSpec.model_validate_json(ranged.model_dump_json()) == ranged
    assert ranged.model_dump(mode="json")["budget"] == {
        "device_gib": {"min": 12.0, "max": 40.0},
        "host_gib": 16.0,
    }
    fixed = JobSpec.model_validate(tiny_spec("f"))
    assert fixed.model_dump(mode="json")["budget"] == {"device_gib": 1.0, "host_gib": 2.0}
    assert not fixed.budget.ranged and fixed.budget.device_range_gib == (1.0, 1.0)


def test_a_chosen_point_is_what_readers_read_and_stays_in_the_range() -> None:
    spec = JobSpec.model_validate(tiny_spec("r", budget=RANGED)).choosing(24, 16)
    assert (spec.budget.device_gib, spec.budget.device_range_gib) == (24.0, (12.0, 40.0))
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again.budget.device_gib == 24.0
    with pytest.raises(ValidationError, match=r"budget.chosen.device_gib=50 is outside"):
        JobSpec.model_validate(
            tiny_spec("r", budget={**RANGED, "chosen": {"device_gib": 50, "host_gib": 16}})
        )


def test_at_budget_fixes_a_point_of_the_range_and_refuses_one_outside() -> None:
    spec = JobSpec.model_validate(tiny_spec("r", budget=RANGED))
    at = spec.at_budget(20, 16)
    assert not at.budget.ranged and (at.budget.device_gib, at.budget.host_gib) == (20.0, 16.0)
    assert at.model_dump(mode="json")["budget"] == {"device_gib": 20.0, "host_gib": 16.0}
    with pytest.raises(ValueError, match=r"budget\.device_gib=41 is outside"):
        spec.at_budget(41, 16)
    with pytest.raises(ValueError, match=r"budget\.host_gib=17 is outside"):
        spec.at_budget(20, 17)
