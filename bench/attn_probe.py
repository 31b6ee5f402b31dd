"""Probe: SDPA backends with grouped-query attention on this GPU (which kernel, saved set,
time). python -m bench.attn_probe"""

import json
import time

import torch
import torch.nn.functional as F


def timed(fn, n=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def main():
    dev = "cuda"
    B, H, KV, S, hd = 1, 32, 8, 8192, 128
    q = torch.randn(B, H, S, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, KV, S, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, KV, S, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    out = {}
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), str(t.dtype), str(t.device), t.nbytes))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out["gqa_saved"] = saved
    out["gqa_grad_fn"] = type(o.grad_fn).__name__
    g = torch.randn_like(o)
    o.backward(g)
    ref = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ke, ve = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
    o2 = F.scaled_dot_product_attention(q, ke, ve, is_causal=True)
    o2.backward(g)
    out["max_diff_out"] = float((o - o2).abs().max())
    out["max_diff_dk"] = float((ref[1] - k.grad).abs().max())
    out["fwd_gqa_ms"] = timed(lambda: F.scaled_dot_product_attention(
        q.detach(), k.detach(), v.detach(), is_causal=True, enable_gqa=True))
    out["fwd_expand_ms"] = timed(lambda: F.scaled_dot_product_attention(
        q.detach(), k.detach().repeat_interleave(4, 1), v.detach().repeat_interleave(4, 1),
        is_causal=True))

    def fb_gqa():
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(g)

    def fb_exp():
        F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                       is_causal=True).backward(g)
    out["fwdbwd_gqa_ms"] = timed(fb_gqa)
    out["fwdbwd_expand_ms"] = timed(fb_exp)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fb_gqa()
        torch.cuda.synchronize()
    out["gqa_kernels"] = sorted({e.name[:90] for e in prof.events()
                                 if e.device_type == torch.autograd.DeviceType.CUDA})[:12]
    # a layer's linear pieces at 8K for the cost split
    x = torch.randn(S, 4096, device=dev, dtype=torch.bfloat16)
    wqkv = torch.randn(6144, 4096, device=dev, dtype=torch.bfloat16)
    wo = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    wg = torch.randn(14336, 4096, device=dev, dtype=torch.bfloat16)
    out["qkv_ms"] = timed(lambda: F.linear(x, wqkv))
    out["o_ms"] = timed(lambda: F.linear(x, wo))
    out["gate_ms"] = timed(lambda: F.linear(x, wg))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
