"""fp8 saved activations (working_set/fp8_saves.py, activation_precision="fp8"): the block
encoding round-trips shape, dtype and strides within e4m3's rounding; a bf16 run with fp8
saves trains like the bf16 run; and what goes home is what the planner counts.

    pytest tests/worker/runtime/working_set/test_fp8_saves.py
"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from tests.worker.runtime.working_set.reference_runs import (
    DIMS,
    Batches,
    fp32_spec,
    make_runtime,
    reference,
)
from wstrain.planning.memory_model import saved_bytes
from wstrain.worker.runtime.working_set import fp8_saves


@pytest.mark.parametrize("permute", [False, True], ids=["contiguous", "transposed"])
def test_encode_decode_keeps_layout_within_e4m3_rounding(permute: bool) -> None:
    torch.manual_seed(0)
    x = (torch.randn(2, 8, 64, 16) * torch.logspace(-3, 2, 16)).bfloat16()
    x[0, 0] = 0.0  # all-zero blocks decode to zero
    if permute:
        x = x.transpose(1, 2)  # SDPA's (B, H, S, hd) views of (B, S, H, hd)
    assert fp8_saves.eligible(x)
    data, scales, layout = fp8_saves.encode(x)
    assert data.dtype == fp8_saves.FP8 and data.numel() == x.numel()
    assert scales.shape == (x.numel() // 128,)
    y = fp8_saves.decode(data, scales, layout)
    assert y.shape == x.shape and y.dtype == x.dtype and y.stride() == x.stride()
    blocks = x.permute(layout.order).reshape(-1, 128).float()
    amax = blocks.abs().amax(1, keepdim=True)
    err = (y.permute(layout.order).reshape(-1, 128).float() - blocks).abs()
    # e4m3: 3 mantissa bits (half a step: 2^-4 relative), subnormals below amax·2^-6/448·...
    assert bool((err <= blocks.abs() * 2**-4 + amax * 2**-15 + 1e-30).all())
    assert not y[0, 0].any() if not permute else True


def test_what_is_not_eligible_stays_exact() -> None:
    assert not fp8_saves.eligible(torch.randn(4, 128))  # fp32 (the log-sum-exp)
    assert not fp8_saves.eligible(torch.randn(3, 50, dtype=torch.bfloat16))  # partial block
    assert not fp8_saves.eligible(torch.randn(8, 64, dtype=torch.bfloat16)[:, ::2])  # strided


def test_bf16_with_fp8_saves_trains_like_bf16_and_sends_what_the_planner_counts() -> None:
    """Two rounds of a step at every level with every set home: the loss equals the bf16
    run's to rounding (the forward is the same; the saves only feed backward) and the
    gradients stay within fp8's error; the host store holds the planner's fp8 count."""
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    for level in (0, 1, 2, 3):
        levels = tuple((level,) * 2 for _ in range(DIMS.num_layers))
        runs = []
        for act in ("bf16", "fp8"):
            rt = make_runtime(
                ref,
                precision="bf16",
                micro_batch=2,
                chunk=1,
                rounds=1,
                window=0,
                levels=levels,
                activation_precision=act,
            )
            loss = rt.forward_backward(data, 0)
            runs.append((loss, rt.host.named_grads(), rt.acts.peak_bytes))
        (l0, g0, _), (l1, g1, home) = runs
        assert abs(l0 - l1) < 1e-6 * abs(l0), (level, l0, l1)
        for name, g in g0.items():
            err = float((g1[name].float() - g.float()).norm() / g.float().norm().clamp_min(1e-30))
            assert err < 0.1, (level, name, err)
        spec = fp32_spec(global_batch=2).model_copy(
            update={"precision": "bf16", "activation_precision": "fp8"}
        )
        want = DIMS.num_layers * 2 * saved_bytes(DIMS, spec, level)
        # each tensor (and each scale vector) rounds up to 256 bytes in the store
        assert want <= home < want + DIMS.num_layers * 2 * 10 * 256, (level, want, home)


def test_fp8_with_fp32_is_refused_naming_the_field() -> None:
    raw = fp32_spec(global_batch=1).model_dump()
    with pytest.raises(ValidationError, match="activation_precision"):
        type(fp32_spec(1)).model_validate({**raw, "activation_precision": "fp8"})


def test_pieces_with_fp8_saves_train_like_bf16() -> None:
    """Long context's pieces send their input and attention output home in fp8 (the
    log-sum-exp stays fp32): the loss is the bf16 run's and gradients stay within fp8's
    error."""
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    levels = tuple((1,) * 4 for _ in range(DIMS.num_layers))
    runs = []
    for act in ("bf16", "fp8"):
        rt = make_runtime(
            ref, precision="bf16", micro_batch=1, chunk=1, rounds=2, window=0, levels=levels,
            seq_chunk=4, activation_precision=act,
        )  # fmt: skip
        runs.append((rt.forward_backward(data, 0), rt.host.named_grads()))
    (l0, g0), (l1, g1) = runs
    assert abs(l0 - l1) < 1e-6 * abs(l0)
    for name, g in g0.items():
        assert float((g1[name].float() - g.float()).norm() / g.float().norm()) < 0.1, name
