"""working_set/state.py HostState: the host arena holds exactly what the planner counts for the
training state (planning/cost_model.py host_state_bytes), in every precision, and never
more than its limit (the host budget); mixed precision keeps bf16 tiles for the link beside
an fp32 master and fp32 moments.

    pytest tests/working_set/test_state.py
"""

from __future__ import annotations

import pytest
import torch

from wstrain.contracts.errors import BudgetExceeded
from wstrain.contracts.model_dims import PRESETS
from wstrain.planning.memory_model import host_state_bytes
from wstrain.worker.runtime.working_set.state import HostState


@pytest.mark.parametrize("preset", ["micro-llama", "tiny-olmoe"])
@pytest.mark.parametrize("precision", ["bf16", "mixed", "fp32"])
def test_arena_holds_what_the_planner_counts(preset: str, precision: str) -> None:
    dims = PRESETS[preset]
    host = HostState.create(dims, precision, pin=False)
    # the rest is each tensor's alignment inside its tile (working_set/arena.py ALIGN_ELEMS),
    # up to 2% of these toy models (the fp32 gradient scratch alone is 7-11%)
    extra = host.arena.total_bytes - host_state_bytes(dims, precision)
    assert 0 <= extra < 0.02 * host.arena.total_bytes


def test_mixed_keeps_bf16_tiles_for_the_link_and_an_fp32_master() -> None:
    dims = PRESETS["micro-llama"]
    host = HostState.create(dims, "mixed", pin=False)
    assert {t.dtype for t in host.weights + host.grads} == {torch.bfloat16}
    assert {t.dtype for t in host.master} == {torch.float32}
    moments = [s["exp_avg"] for o, p in zip(host.optimizers, host.params) for s in [o.state[p]]]
    assert {t.dtype for t in moments} == {torch.float32}
    assert host.arena.bytes_by_kind["master"] == 4 * sum(t.numel() for t in host.master)


def test_arena_refuses_to_grow_past_its_limit() -> None:
    dims = PRESETS["micro-llama"]
    state = host_state_bytes(dims, "bf16")
    with pytest.raises(BudgetExceeded, match=r"past its limit .*raise budget.host_gib"):
        HostState.create(dims, "bf16", pin=False, arena_limit_bytes=state // 2)
    host = HostState.create(dims, "bf16", pin=False, arena_limit_bytes=state + 2**20)
    before = host.arena.total_bytes
    with pytest.raises(BudgetExceeded, match=r"activations"):
        host.arena.alloc("acts0", 2**21, torch.uint8, "activations")
    assert host.arena.total_bytes == before  # the refused tile took nothing
