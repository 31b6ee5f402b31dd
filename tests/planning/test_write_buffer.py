"""The write buffer as a planned quantity (Layout.write_buffer_bytes, planning/layouts.py
write_buffers): whole sequences whose full saved set outgrows the 1 GiB default are also
costed with 2 and 4 GiB, the buffer's device bytes charged, and the plan carries the size to
the runtime; pieces and short sequences keep the default; an override pins it.

    pytest tests/planning/test_write_buffer.py
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.helpers.specs import working_set_spec as _spec
from wstrain.contracts.calibration import GIB, WRITE_BUFFER_BYTES
from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.hardware import H200
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning import memory_model as mm
from wstrain.planning.layouts import WRITE_BUFFER_GAIN, write_buffers
from wstrain.planning.working_set import make_ws_plan, weighed
from wstrain.worker.build import ws_config

DIMS = PRESETS["llama3-8b"]


def _fp8(spec: JobSpec) -> JobSpec:
    return JobSpec.model_validate({**spec.model_dump(), "activation_precision": "fp8"})


def test_a_32k_sequence_plans_a_larger_buffer_where_it_predicts_faster() -> None:
    """32K tokens: a layer's whole saved set (1.66 GiB with fp8 sets) is more than the
    default buffer holds, so the DP recomputed the MLP of nearly every layer; with a larger
    buffer layers keep it, the plan is faster than with the default pinned, and it fits."""
    spec = _fp8(_spec(DIMS, 32768, 8, 24, 240))
    assert mm.saved_bytes(DIMS, spec, 3) > WRITE_BUFFER_BYTES
    assert write_buffers(spec, DIMS, 0) == [GIB, 2 * GIB, 4 * GIB]
    plan = make_ws_plan(spec, DIMS, H200)
    pinned = make_ws_plan(_fp8(_spec(DIMS, 32768, 8, 24, 240, write_buffer_gib=1)), DIMS, H200)
    ws, ws1 = plan.working_set, pinned.working_set
    assert ws is not None and ws1 is not None
    assert ws1.write_buffer_bytes == GIB
    assert ws.write_buffer_bytes > GIB
    assert plan.predicted.step_seconds * (1 + WRITE_BUFFER_GAIN) < pinned.predicted.step_seconds
    kept = sum(lv == 3 for row in ws.levels for lv in row)
    assert kept > sum(lv == 3 for row in ws1.levels for lv in row)
    assert plan.predicted.peak_device_bytes <= 24 * GIB
    assert "write buffer" in plan.reasons["levels"]
    assert "1 GiB (override)" in pinned.reasons["levels"]


def test_a_larger_buffer_must_buy_its_gain() -> None:
    """The search ranks a candidate with a buffer past the default WRITE_BUFFER_GAIN slower
    than predicted: at a smaller gain, inside the predictions' error, the default stays."""
    default, larger = mm.Layout(1), mm.Layout(1, write_buffer_bytes=2 * GIB)
    assert weighed(default, 10.0) == 10.0
    assert weighed(larger, 10.0) == pytest.approx(10.0 * (1 + WRITE_BUFFER_GAIN))
    assert weighed(larger, 9.95) > weighed(default, 10.0)  # 0.5% faster: not enough
    assert weighed(larger, 9.8) < weighed(default, 10.0)  # 2%: taken


def test_the_buffer_is_device_memory_the_plan_charges() -> None:
    spec = _spec(DIMS, 32768, 8, 24, 240)
    lay = mm.Layout(1)
    larger = mm.Layout(1, write_buffer_bytes=4 * GIB)
    extra = mm.fixed_device_bytes(DIMS, spec, larger, 0) - mm.fixed_device_bytes(DIMS, spec, lay, 0)
    assert extra >= 3 * GIB


def test_pieces_and_short_sequences_keep_the_default() -> None:
    assert write_buffers(_spec(DIMS, 8192, 16, 24, 110), DIMS, 0) == [WRITE_BUFFER_BYTES]
    assert write_buffers(_spec(DIMS, 131072, 1, 24, 110), DIMS, 8192) == [WRITE_BUFFER_BYTES]


def test_a_refusal_counts_the_buffer_an_override_pins() -> None:
    """The smallest budget a refusal names holds the override's buffer: never one the job
    already has."""
    spec = _spec(DIMS, 32768, 1, 12, 110, write_buffer_gib=16)
    with pytest.raises(InfeasibleBudget) as refused:
        make_ws_plan(spec, DIMS, H200)
    assert refused.value.min_budget["device_gib"] > 12


def test_an_override_pins_it_and_reaches_the_runtime() -> None:
    spec = _spec(DIMS, 32768, 1, 24, 110, write_buffer_gib=2)
    plan = make_ws_plan(spec, DIMS, H200)
    assert plan.working_set is not None and plan.working_set.write_buffer_bytes == 2 * GIB
    assert "2 GiB (override)" in plan.reasons["levels"]
    assert ws_config(spec, plan).write_buffer_bytes == 2 * GIB


@pytest.mark.parametrize("gib", [0, -1, 1e-10, 0.01, 65])
def test_an_out_of_range_override_names_the_field(gib: float) -> None:
    with pytest.raises(ValidationError, match="write_buffer_gib"):
        _spec(DIMS, 32768, 1, 24, 110, write_buffer_gib=gib)


def test_a_buffer_smaller_than_a_saved_tensor_is_charged_that_tensor() -> None:
    """The host store sends a tensor larger than the buffer alone (host_store.admit), so a
    pinned 64 MiB buffer at 32K tokens holds an MLP gate of 32K x 14,336 bf16 (896 MiB) in
    flight: the device charge counts the tensor, not the buffer."""
    spec = _spec(DIMS, 32768, 1, 24, 240, write_buffer_gib=1 / 16)
    gate = 32768 * DIMS.intermediate_size * 2
    small = mm.Layout(1, write_buffer_bytes=GIB // 16)
    default = mm.Layout(1)
    no_home = mm.layer_temporaries_bytes(DIMS, spec, small, DIMS.num_layers)  # nothing sent
    assert mm.layer_temporaries_bytes(DIMS, spec, small, 0) - no_home == gate
    assert mm.layer_temporaries_bytes(DIMS, spec, default, 0) - no_home == GIB
