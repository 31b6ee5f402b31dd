"""ProTrain's refinement of the cost model: time one real decoder layer of the job's model at
the job's sequence length on this node's device (the runtime's own layer functions), so the
planner predicts from measured times instead of FLOP counts alone.

    python -m wstrain.worker.profile.layer --spec job_dir/spec.json     # prints LayerTimes as JSON

The scheduler agent runs it before planning a job on a GPU and caches the result per model
shape, sequence length and hardware profile key.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from wstrain.contracts.model_dims import ModelDims, resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.worker.models.blocks import attn_block, ffn_block, leaves
from wstrain.worker.models.rope import rope_tables
from wstrain.worker.runtime.working_set.arena import LayerLayout


def _weights(dims: ModelDims, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """One layer's weights in the runtime's own tile layout: random, RMSNorms at one."""
    layout = LayerLayout.decoder(dims)
    flat = torch.randn(layout.numel, dtype=dtype, device=device) * 0.02
    w = layout.views(flat)
    for name, v in w.items():
        if name.endswith("norm.weight"):
            v.fill_(1.0)
    return w


def _time(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def measure(dims: ModelDims, seq_len: int, precision: str, repeats: int = 3) -> dict[str, float]:
    """Seconds of one sequence through one layer: forward, backward (everything saved), and
    the forward's attention and MLP blocks (the cost model splits recomputation by them)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    w = _weights(dims, dtype, device)
    cos, sin = rope_tables(dims, seq_len, device, dtype)
    x = torch.randn(1, seq_len, dims.hidden_size, dtype=dtype, device=device)  # (B, S, D)
    dy = torch.randn_like(x)
    with torch.no_grad():
        h = attn_block(x, w, dims, cos, sin)
        attention_s = _time(lambda: attn_block(x, w, dims, cos, sin), repeats, device)
        mlp_s = _time(lambda: ffn_block(h, w, dims), repeats, device)

    def forward_backward() -> None:
        xa, wl = x.detach().requires_grad_(), leaves(w)
        ffn_block(attn_block(xa, wl, dims, cos, sin), wl, dims)[0].backward(dy)

    both_s = _time(forward_backward, repeats, device)
    forward_s = attention_s + mlp_s
    return {
        "seq_len": float(seq_len),
        "forward_s": forward_s,
        "backward_s": max(both_s - forward_s, forward_s),
        "attention_forward_s": attention_s,
        "mlp_forward_s": mlp_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True, help="a JobSpec JSON file")
    parser.add_argument(
        "--dims",
        type=Path,
        default=None,
        help="the model's dims as JSON (the agent's, read under the data roots); default: "
        "resolved from the spec's model",
    )
    args = parser.parse_args()
    spec = JobSpec.model_validate_json(args.spec.read_text())
    if args.dims is not None:
        fields = json.loads(args.dims.read_text())
        if fields.get("rope_llama3") is not None:  # JSON has no tuples
            fields["rope_llama3"] = tuple(fields["rope_llama3"])
        dims = ModelDims(**fields)
    else:
        dims = resolve_dims(spec.model)
    json.dump(measure(dims, spec.seq_len, spec.precision), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
