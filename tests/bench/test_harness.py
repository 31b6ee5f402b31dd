"""bench/harness.py on CPU: the random tokens every benchmark child trains on (targets are
the inputs shifted by one; packed documents restart their positions) and the GC pause
counter.

    pytest tests/bench/test_harness.py
"""

from __future__ import annotations

import gc

import pytest
import torch

from bench.harness import GcPauses, RandomTokens, time_steps


def test_targets_are_the_inputs_shifted_by_one_and_a_seed_repeats_its_tokens() -> None:
    data = RandomTokens(vocab=97, seq_len=16, device="cpu", seed=3)
    x, y = data.batch(0, 0, 4)
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < 97 and int(x.min()) >= 0
    again, _ = RandomTokens(vocab=97, seq_len=16, device="cpu", seed=3).batch(0, 0, 4)
    assert torch.equal(x, again)
    assert data.target_tokens(0, 4) == 64


def test_packed_documents_restart_their_positions() -> None:
    data = RandomTokens(vocab=97, seq_len=10, device="cpu", document_tokens=4)
    positions, segments = data.documents(0, 0, 2)
    assert positions[0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]  # the last document cut
    assert segments[1].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="no documents"):
        RandomTokens(97, 10, "cpu").documents(0, 0, 1)


def test_gc_pauses_count_each_collection_by_generation() -> None:
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    try:
        gc.collect(1)
        gc.collect(2)
    finally:
        gc.callbacks.remove(pauses)
    per_step = pauses.per_step(2)
    assert {"gen1", "gen2", "longest"} <= per_step.keys()
    assert all(v > 0 for v in per_step.values())
    assert per_step["longest"] <= 2 * max(per_step["gen1"], per_step["gen2"])  # one of them


def test_time_steps_runs_each_step_once_in_order() -> None:
    seen: list[int] = []
    times = time_steps(seen.append, 3)
    assert seen == [0, 1, 2] and len(times) == 3 and all(t >= 0 for t in times)
