"""Job specs that tests in more than one module plan: a working-set spec for any model dims
and budget, and a valid spec whose planning takes measurable time."""

from __future__ import annotations

from typing import Any

from tests.conftest import tiny_spec
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import JobSpec


def working_set_spec(
    dims: ModelDims, seq: int, batch: int, dev: float, host: float, **overrides: object
) -> JobSpec:
    """A synthetic-data bf16 spec for `dims` on the working-set runtime, budget `dev` GiB of
    device and `host` GiB of host memory; `overrides` go to the spec's overrides."""
    hf = {**dims.to_hf_config(), "max_position_embeddings": max(seq, 8192)}
    return JobSpec.model_validate(
        {
            "name": "a",
            "model": {"hf_config": hf},
            "data": {"kind": "synthetic"},
            "seq_len": seq,
            "global_batch": batch,
            "steps": 1,
            "precision": "bf16",
            "budget": {"device_gib": dev, "host_gib": host},
            "overrides": {"runtime": "working_set", **overrides},
        }
    )


def slow_plan_spec() -> dict[str, Any]:
    """A valid spec whose planning takes measurable time: the saved-activation DP over 384
    layers x 768 sequences plans in about 0.7 s on one core."""
    hf = {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 384,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
    }
    return tiny_spec(
        "slow-plan",
        model={"hf_config": hf},
        data={"kind": "synthetic"},
        seq_len=8192,
        global_batch=768,
        precision="bf16",
        budget={"device_gib": 40, "host_gib": 4000},
    )
