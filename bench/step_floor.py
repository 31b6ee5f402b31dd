"""A long-context step's floor at the rates its own kernels ran in a profiled step, and the
least step those rates allow: what no scheduling can beat on that machine. CPU only, from
recorded rows.

The kernel floor of bench/long_context.py times the step's GEMM and attention alone, in a
burst, at the card's boost clock; a step that computes for minutes runs them under the
card's power cap (the lent H200s: 700 W, SM clock ~1,600 of 1,980 MHz). A row run with
`--profile` records the GPU time of each kernel kind in one step (`timeline`), so the
rates the step's own GEMMs and attention ran at follow from the FLOPs that step computed:
the model's (the floor's) plus what its plan recomputes, per (layer, unit) level
(working_set/schedule.py: 0 the attention block and the MLP's gate/up, 1 the output
projection and gate/up, 2 the attention block, 3 the output projection; a level that
recomputes attention runs the unit's forward, 2·H·hd·(s1² - s0²) FLOPs for queries
[s0, s1)). A plan records how many units sit at each level, not which: units that
recompute attention are taken to be each layer's first pieces (the planner's cheapest
per byte), exact wherever no unit is at level 0 or 2.

At those rates, any row of the same machine and kernel then has

    least step = its floor's FLOPs / the in-step rates + its planned recomputation's
                 + the profile's other kernels (norms, SwiGLU, the loss, the sums)
                 per token-layer

with no stall, no idle and no launch gap: a lower bound on its step while the clock stays
where the profile found it (the other kernels scale with tokens x layers here, the loss's
softmax with tokens only; `kernels_only_s` leaves them out). `model_only_tokens_per_s`
goes further: no recomputation and, of the other kernels, only the model's own elementwise
work (norms, SwiGLU, RoPE, the loss, residual adds), what any runtime would run.

    python -m bench.step_floor \
        --rates-of profile-256k-16-layers-fa3-h200-2026-11-29.json:long-262144 \
        --rows fa3-vs-cudnn-256k-32-layers-host-240gib-h200-2026-11-29.json:long-262144 \
        --out X.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.long_context import ADAWS_TOKENS_PER_S, floor_flops
from bench.specs import llama_dims
from wstrain.contracts.model_dims import ModelDims

ROWS_DIR = Path(__file__).parent / "results" / "long-context"
# the model's own elementwise kernels (norms, SwiGLU, RoPE, the loss's softmax, residual
# adds), which any runtime runs; the rest of "other" is this one's bookkeeping (the
# pieces' gradient sums, fills, casts, copies), which a better one might not
MODEL_ELEMENTWISE = ("_rms_", "_silu_mul", "_rope", "SoftMax", "nll_loss", "add<c10::BFloat16>")


@dataclass(frozen=True)
class StepFlops:
    gemm: float  # the model's GEMMs (6·Ψ a token, the LM head's included)
    attention: float  # causal attention as the floor counts it: forward and backward, 3.5x
    recompute_gemm: float
    recompute_attention: float  # forwards only


def load_row(ref: str) -> dict[str, Any]:
    """FILE:NAME, a row of bench/results/long-context/ (or a path)."""
    file, name = ref.rsplit(":", 1)
    path = Path(file) if Path(file).exists() else ROWS_DIR / file
    return next(r for r in json.loads(path.read_text()) if r.get("name") == name)


def step_flops(row: dict[str, Any], dims: ModelDims) -> StepFlops:
    """What one step of `row` computes on the GPU, its plan's recomputation apart."""
    seq, sequences = row["seq_len"], row["global_batch"]
    ws = row["plan"]["working_set"]
    h, kv, hd, d = dims.num_heads, dims.num_kv_heads, dims.head_dim, dims.hidden_size
    piece = ws["seq_chunk"] or seq
    pieces = seq // piece
    qkv, o = 2 * d * (h + 2 * kv) * hd, 2 * d * h * hd  # a token's FLOPs
    gate_up = 4 * d * dims.intermediate_size
    per_level = (qkv + o + gate_up, o + gate_up + (qkv if dims.qk_norm else 0), qkv + o, o)
    counts = ws["levels"]  # units at each level, one sequence's (layer, piece) units
    assert sum(counts) == dims.num_layers * pieces, (counts, dims.num_layers, pieces)
    recompute_gemm = sum(n * piece * f for n, f in zip(counts, per_level, strict=True))
    # units recomputing attention: each layer's first pieces, spread evenly over the layers
    attention_units = counts[0] + counts[2]
    first, extra = divmod(attention_units, dims.num_layers)
    recompute_attention = 0.0
    for layer in range(dims.num_layers):
        for p in range(first + (layer < extra)):
            s0, s1 = p * piece, (p + 1) * piece
            recompute_attention += 2 * h * hd * (s1 * s1 - s0 * s0)
    gemm, attention = floor_flops(dims, seq, sequences)
    return StepFlops(
        gemm=gemm,
        attention=attention,
        recompute_gemm=sequences * recompute_gemm,
        recompute_attention=sequences * recompute_attention,
    )


@dataclass(frozen=True)
class InStepRates:
    gemm_flops_per_s: float
    attention_flops_per_s: float
    gemm_over_burst: float  # over the node profile's GEMM rate
    attention_over_timed: float  # over the row's attention timed alone after the run
    other_s_per_token_layer: float
    model_elementwise_s_per_token_layer: float  # MODEL_ELEMENTWISE's part of it
    idle_s: float


def in_step_rates(row: dict[str, Any]) -> InStepRates:
    """The rates a profiled row's GEMMs and attention ran at inside its step."""
    t = row["timeline"]["kernel_s_by_kind"]
    dims = llama_dims(row["layers"])
    f = step_flops(row, dims)
    gemm = (f.gemm + f.recompute_gemm) / t["gemm"]
    attention = (f.attention + f.recompute_attention) / t["attention"]
    plan = row["plan"]
    tokens = row["global_batch"] * row["seq_len"]
    model = sum(
        s
        for name, s in row["timeline"]["top_kernels_s"].items()
        if any(k in name for k in MODEL_ELEMENTWISE)
    )
    return InStepRates(
        gemm_flops_per_s=gemm,
        attention_flops_per_s=attention,
        gemm_over_burst=gemm / plan["node"]["matmul_flops"],
        attention_over_timed=attention / plan["attention_fwd_bwd_flops"],
        other_s_per_token_layer=t["other"] / (tokens * row["layers"]),
        model_elementwise_s_per_token_layer=model / (tokens * row["layers"]),
        idle_s=row["timeline"]["idle_s"],
    )


def measured_step_s(row: dict[str, Any]) -> float:
    """The row's step: its profiled one where it has one (a `--profile --steps 1` row's
    timed step is its warm-up), else its timed steps' mean."""
    timeline = row.get("timeline")
    return float(timeline["wall_s"]) if timeline else float(row["measured_step_seconds"])


def least_step(row: dict[str, Any], rates: InStepRates) -> dict[str, Any]:
    """`row`'s floor and least step at `rates` (in_step_rates of a profiled row), beside
    what it measured and AdaWS's step for its length."""
    dims = llama_dims(row["layers"])
    f = step_flops(row, dims)
    floor_s = f.gemm / rates.gemm_flops_per_s + f.attention / rates.attention_flops_per_s
    recompute_s = (
        f.recompute_gemm / rates.gemm_flops_per_s
        + f.recompute_attention / rates.attention_flops_per_s
    )
    tokens = row["global_batch"] * row["seq_len"]
    other_s = rates.other_s_per_token_layer * tokens * row["layers"]
    measured_s = measured_step_s(row)
    least_s = floor_s + recompute_s + other_s
    model_s = rates.model_elementwise_s_per_token_layer * tokens * row["layers"]
    adaws = ADAWS_TOKENS_PER_S.get(row["seq_len"]) if row["layers"] == 32 else None
    out = {
        "row": row["name"],
        "layers": row["layers"],
        "seq_len": row["seq_len"],
        "global_batch": row["global_batch"],
        "attention_kernel": row.get("attention_kernel"),
        "measured_step_seconds": measured_s,
        "burst_floor_step_seconds": row["plan"]["kernel_floor_step_seconds"],
        "in_step_floor_seconds": floor_s,
        "in_step_floor_ratio": floor_s / measured_s,
        "recompute_seconds": recompute_s,
        "other_kernels_seconds": other_s,
        "kernels_only_s": floor_s + recompute_s,
        "least_step_seconds": least_s,
        "least_step_tokens_per_s": tokens / least_s,
        "least_over_measured": least_s / measured_s,
        "without_recompute_tokens_per_s": tokens / (floor_s + other_s),
        # the least a runtime with no bookkeeping kernels and no recomputation could take
        "model_elementwise_seconds": model_s,
        "model_only_tokens_per_s": tokens / (floor_s + model_s),
    }
    if adaws:
        out["adaws_tokens_per_s"] = adaws
        out["adaws_step_seconds"] = tokens / adaws
        out["least_step_over_adaws_step"] = least_s * adaws / tokens
        out["model_only_over_adaws"] = out["model_only_tokens_per_s"] / adaws
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates-of", required=True, help="FILE:NAME, a row run with --profile")
    ap.add_argument("--rows", default="", help="comma-separated FILE:NAME rows to bound")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    profiled = load_row(args.rates_of)
    rates = in_step_rates(profiled)
    refs = [r for r in args.rows.split(",") if r]
    rows = [least_step(load_row(ref), rates) | {"ref": ref} for ref in refs]
    result = {
        "rates_of": args.rates_of,
        "rates": asdict(rates),
        "profiled": least_step(profiled, rates),
        "rows": rows,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
