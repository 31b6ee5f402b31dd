"""The jobs the GPU benchmarks train, and a result row's job read back: Llama-3-8B dimensions
at N layers as a JobSpec on synthetic tokens, the precisions a row's name selects, and the
spec, model dims, node profile and link share a `bench/runtime.py` row was planned with.
Neither torch nor a GPU: `bench/bound.py`, `bench/overlap_plan.py` and
`bench/window_buffer.py` re-plan measured rows from here on any CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

from wstrain.contracts.calibration import LINK_SHARE
from wstrain.contracts.hardware import LayerTimes, NodeProfile
from wstrain.contracts.model_dims import PRESETS, ModelDims
from wstrain.contracts.spec import JobSpec

# every row's host budget: a lent node has 125 GiB, and a 16-layer row's arena measured
# 55-70 GiB (the state, its gradients and moments, and the saved sets sent home)
HOST_BUDGET_GIB = 100


def llama_dims(layers: int) -> ModelDims:
    """Llama-3-8B's dimensions with `layers` decoder layers."""
    return replace(PRESETS["llama3-8b"], num_layers=layers)


def job_precision(name: str) -> str:
    """JobSpec.precision of a row: "mixed" for a row named *-mixed, else "bf16"."""
    return "mixed" if name.endswith("-mixed") else "bf16"


def job_activation_precision(name: str) -> str:
    """JobSpec.activation_precision of a row: "fp8" for a row named *-fp8, else "bf16"."""
    return "fp8" if name.endswith("-fp8") else "bf16"


def llama_spec(
    name: str,
    layers: int,
    seq: int,
    global_batch: int,
    steps: int,
    device_gib: float,
    host_gib: float,
    overrides: dict[str, object],
    precision: str = "bf16",
    activation_precision: str = "bf16",
) -> JobSpec:
    """A JobSpec for Llama-3-8B dimensions with `layers` layers, on synthetic tokens."""
    dims = llama_dims(layers)
    return JobSpec.model_validate(
        {
            "name": name,
            "model": {
                "hf_config": {
                    "vocab_size": dims.vocab_size,
                    "hidden_size": dims.hidden_size,
                    "intermediate_size": dims.intermediate_size,
                    "num_hidden_layers": dims.num_layers,
                    "num_attention_heads": dims.num_heads,
                    "num_key_value_heads": dims.num_kv_heads,
                    "rope_theta": dims.rope_theta,
                    "max_position_embeddings": 131072,
                }
            },
            "data": {"kind": "synthetic"},
            "seq_len": seq,
            "global_batch": global_batch,
            "steps": steps,
            "precision": precision,
            "activation_precision": activation_precision,
            "optimizer": {"lr": 1e-4},
            "budget": {"device_gib": device_gib, "host_gib": host_gib},
            "overrides": {"runtime": "working_set", **overrides},
        }
    )


def spec_dims_of(row: dict[str, Any]) -> tuple[JobSpec, ModelDims]:
    """The row's JobSpec and model dims, as bench/runtime.py planned them."""
    dims = llama_dims(int(row["layers"]))
    spec = llama_spec(
        row["name"],
        dims.num_layers,
        int(row["seq_len"]),
        int(row["global_batch"]),
        3,
        float(row["device_budget_gib"]),
        HOST_BUDGET_GIB,
        {},
        precision=job_precision(row["name"]),
        activation_precision=job_activation_precision(row["name"]),
    )
    return spec, dims


def node_from_row(row: dict[str, Any]) -> NodeProfile:
    """The node profile a benchmark row was planned with (bench/runtime.py keeps it): its
    (length, rate) lists as tuples, fields a later profile added at their defaults."""
    n = row["plan"]["node"]
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(NodeProfile):
        if f.name not in n:
            continue
        v = n[f.name]
        if f.name.endswith("_points") or f.name == "d2h_by_gpus":
            v = tuple((int(s), float(x)) for s, x in v)
        elif f.name == "layer" and v is not None:
            v = LayerTimes(**v)
        kw[f.name] = v
    return NodeProfile(**kw)


def link_share_of(row: dict[str, Any]) -> float:
    """The share of the link the row's plan gave saved sets (bench.runtime --link-share; a
    row without one was planned at LINK_SHARE)."""
    return float(row["plan"].get("link_share") or LINK_SHARE)
