"""A long sequence's window of keys and values on the host (Layout.window_home,
worker/ops/host_window.py) in the planner: its device bytes shrink to two staged key
blocks, its host bytes join the host budget, its traffic is costed, so the planner takes it
where the device cannot hold the window (a million tokens at 24 GiB) and not where the
window fits; a refusal names the host that the window on the host needs.

    pytest tests/planning/test_window_home.py
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from tests.helpers.specs import working_set_spec as _spec
from wstrain.contracts.calibration import GIB
from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.hardware import H200
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning import cost_model as cm
from wstrain.planning import memory_model as mm
from wstrain.planning.working_set import make_ws_plan

MILLION = 1 << 20


def _fp8(dims, seq: int, dev: float, host: float, **overrides: object) -> JobSpec:  # type: ignore[no-untyped-def]
    spec = _spec(dims, seq, 1, dev, host, **overrides)
    return JobSpec.model_validate({**spec.model_dump(), "activation_precision": "fp8"})


def test_a_window_on_the_host_is_two_blocks_on_the_device_and_12_kib_a_token_home() -> None:
    dims, spec = PRESETS["llama3-8b"], _spec(PRESETS["llama3-8b"], MILLION, 1, 24, 120)
    on_device = mm.Layout(1, seq_chunk=8192, pieces=128)
    home = replace(on_device, window_home=True)
    assert mm.host_window_bytes(dims, spec, on_device) == 0
    assert mm.host_window_bytes(dims, spec, home) == MILLION * 12 * 1024  # 12 GiB
    freed = mm.context_window_bytes(dims, spec, on_device) - mm.context_window_bytes(
        dims, spec, home
    )
    assert freed == (MILLION - 2 * 65536) * 12 * 1024  # all but two 64K-key slots
    base = mm.host_bytes(dims, spec, 0, "cuda", lay=on_device)
    assert mm.host_bytes(dims, spec, 0, "cuda", lay=home) == base + 12 * GIB
    assert cm.window_stream_s(dims, spec, on_device, H200) == 0.0
    assert cm.window_stream_s(dims, spec, home, H200) > 0.0


def test_a_million_tokens_plan_at_24_gib_with_the_window_on_the_host() -> None:
    """16 layers, fp8 saved sets: the window on the device (12 GiB) does not fit 24 GiB;
    on the host it does, with the host counting it."""
    dims = replace(PRESETS["llama3-8b"], num_layers=16)
    plan = make_ws_plan(_fp8(dims, MILLION, 24, 120), dims, H200)
    ws = plan.working_set
    assert ws is not None and ws.window_home and 0 < ws.seq_chunk < MILLION
    assert plan.predicted.peak_device_bytes <= 24 * GIB
    assert 12 * GIB < plan.predicted.peak_host_bytes <= 120 * GIB
    with pytest.raises(InfeasibleBudget) as err:  # the window pinned to the device
        make_ws_plan(_fp8(dims, MILLION, 24, 120, window_home=False), dims, H200)
    assert err.value.min_budget["device_gib"] > 24


def test_a_host_short_of_the_window_is_told_the_host_that_holds_it() -> None:
    """At 24 GiB only the window on the host fits the device: the refusal's host counts it,
    and that host plans."""
    dims = replace(PRESETS["llama3-8b"], num_layers=16)
    with pytest.raises(InfeasibleBudget) as err:
        make_ws_plan(_fp8(dims, MILLION, 24, 110), dims, H200)
    host_gib = err.value.min_budget["host_gib"]
    assert host_gib > 110
    plan = make_ws_plan(_fp8(dims, MILLION, 24, host_gib + 1), dims, H200)
    assert plan.working_set is not None and plan.working_set.window_home


def test_where_the_window_fits_the_device_it_stays_there() -> None:
    """128K tokens at 24 GiB: the window (1.5 GiB) fits, and its traffic would only cost
    time; pinned on the host the same job predicts a slower step."""
    dims = replace(PRESETS["llama3-8b"], num_layers=32)
    plan = make_ws_plan(_spec(dims, 131072, 1, 24, 110), dims, H200)
    assert plan.working_set is not None and not plan.working_set.window_home
    home = make_ws_plan(_spec(dims, 131072, 1, 24, 110, window_home=True), dims, H200)
    assert home.working_set is not None and home.working_set.window_home
    assert home.predicted.step_seconds > plan.predicted.step_seconds


def test_the_window_on_the_host_with_packed_documents_is_refused() -> None:
    spec = _spec(PRESETS["llama3-8b"], 131072, 1, 24, 110, window_home=True).model_dump()
    with pytest.raises(ValidationError, match=r"overrides\.window_home"):
        JobSpec.model_validate({**spec, "document_mask": True})
