"""The window of keys and values on the host (worker/ops/host_window.py) against the window
on the device (ops/chunk_attn.py ContextWindow), one attention block through pieces forward
and backward (chunk_attn_forward, chunk_attn_backward): the same outputs, input gradients
and weight gradients. On CUDA in bf16 at Llama-3's 32:8 heads and head dim 128 on each fused
kernel (its staging on a copy stream, events and the pinned window exercised); the CPU
reference of the whole runtime is tests/worker/runtime/working_set/test_sequence_chunks.py.

    pytest tests/worker/ops/test_host_window.py
"""

from __future__ import annotations

import pytest
import torch

from tests.worker.ops.kernels import FUSED, use_kernel
from tests.worker.relative_error import rel_err
from wstrain.contracts.model_dims import ModelDims
from wstrain.worker.models.rope import rope_tables
from wstrain.worker.ops import prefix_attn
from wstrain.worker.ops.chunk_attn import (
    ContextWindow,
    Window,
    chunk_attn_backward,
    chunk_attn_forward,
)
from wstrain.worker.ops.host_window import HostWindow

DIMS = ModelDims(128, 4096, 1024, 1, 32, 8, 128)
NAMES = {
    "input_layernorm.weight": (4096,),
    "self_attn.q_proj.weight": (4096, 4096),
    "self_attn.k_proj.weight": (1024, 4096),
    "self_attn.v_proj.weight": (1024, 4096),
    "self_attn.o_proj.weight": (4096, 4096),
}


def _through(win: Window, x: torch.Tensor, dh: torch.Tensor, w, spans, cos, sin):  # type: ignore[no-untyped-def]
    """Pieces forward, the window rebuilt, pieces backward reversed: (h, dx, dw)."""
    dw = {n: torch.zeros_like(t) for n, t in w.items()}
    hs = [chunk_attn_forward(x[:, s0:s1], w, DIMS, cos[s0:s1], sin[s0:s1], win, s0)[0]
          for s0, s1 in spans]  # fmt: skip
    for s0, s1 in spans:
        win.put(x[:, s0:s1], w, DIMS, cos[s0:s1], sin[s0:s1], s0, want_queries=False)
    win.zero_grads()
    dx = [
        chunk_attn_backward(
            dh[:, s0:s1], x[:, s0:s1], None, None, w, DIMS, cos[s0:s1], sin[s0:s1], win, s0, dw
        )
        for s0, s1 in reversed(spans)
    ]
    return torch.cat(hs, 1), torch.cat(dx[::-1], 1), dw


@pytest.mark.parametrize("kernel", FUSED)
def test_host_window_equals_the_device_window_on_cuda(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 tokens in pieces of 640 (not a divisor) and key blocks of 1,024: prefixes of
    several blocks, backward blocks straddling pieces; recomputed attention forwards (no
    saved output), so the backward stages each piece's own keys too."""
    use_kernel(kernel, monkeypatch)
    monkeypatch.setattr(prefix_attn, "ATTENTION_KEY_BLOCK_TOKENS", 1024)
    dev, bf16, s = torch.device("cuda"), torch.bfloat16, 3000
    g = torch.Generator(device="cpu").manual_seed(0)
    w = {n: (torch.randn(shape, generator=g) * 0.02).to(dev, bf16) for n, shape in NAMES.items()}
    w["input_layernorm.weight"].fill_(1.0)
    x = torch.randn(1, s, 4096, generator=g).to(dev, bf16)
    dh = torch.randn(1, s, 4096, generator=g).to(dev, bf16)
    cos, sin = rope_tables(DIMS, s, dev, bf16)
    spans = [(s0, min(s0 + 640, s)) for s0 in range(0, s, 640)]
    device = _through(ContextWindow.like(DIMS, 1, s, bf16, dev), x, dh, w, spans, cos, sin)
    host = _through(HostWindow(DIMS, 1, s, 640, bf16, dev), x, dh, w, spans, cos, sin)
    torch.cuda.synchronize()
    for name, a, b in [("h", host[0], device[0]), ("dx", host[1], device[1])]:
        assert rel_err(a.float(), b.float()) < 1e-2, name
    for n in NAMES:
        assert rel_err(host[2][n].float(), device[2][n].float()) < 1e-2, n
