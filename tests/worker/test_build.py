"""A working-set job started from scratch (no `model.path`): its host tiles hold the resident
runtime's initial weights for the seed, and building it never holds a whole fp32 model
beside its training state (a 32 B model's would be 131 GB: a worker of a 180 GiB host
budget would take the node's memory at start).

    pytest tests/worker/test_build.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.worker.build import build_runtime


def _spec(runtime: str, model: dict[str, object], precision: str = "fp32") -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "scratch", "model": model, "data": {"kind": "synthetic"}, "seq_len": 32,
            "global_batch": 2, "steps": 1, "seed": 11, "precision": precision,
            "budget": {"device_gib": 8, "host_gib": 8}, "overrides": {"runtime": runtime},
        }
    )  # fmt: skip


def test_the_working_set_starts_at_the_resident_weights() -> None:
    model = {"preset": "tiny-olmoe"}  # q/k norms and experts beside the dense names
    built = {}
    for runtime in ("working_set", "resident"):
        spec = _spec(runtime, model)
        rt = build_runtime(spec, make_plan(spec, resolve_dims(spec.model), DEFAULT_PROFILE))
        built[runtime] = {k: v.detach().cpu().clone() for k, v in rt.state_tensors().items()}
    ws, resident = built["working_set"], built["resident"]
    assert set(ws) == set(resident)
    for name, value in resident.items():
        assert torch.equal(ws[name], value), name
    assert any(not torch.equal(v, torch.ones_like(v)) for v in ws.values())  # not all norms


# 8 layers of 1024 and an 8K vocabulary: 110 M parameters, a 0.44 GB fp32 model beside a
# 0.88 GB bf16 state (weights, gradients, two moments), of which building it touches the
# weights' 0.22 GB; its largest tensor is a 33 MB fp32 embedding
HF_CONFIG = {
    "vocab_size": 8000, "hidden_size": 1024, "intermediate_size": 2816,
    "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8,
}  # fmt: skip

CHILD = """
import json, resource, sys
import torch
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.worker.build import build_runtime
from wstrain.worker.models import initial
initial.AHEAD_BYTES = 32 << 20  # drawn ahead of the copy: 1 GiB would be this whole model
spec = JobSpec.model_validate_json(sys.argv[1])
dims = resolve_dims(spec.model)
plan = make_plan(spec, dims, DEFAULT_PROFILE)
torch.randn(1 << 20)  # torch's own first-use allocations before the baseline
before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rt = build_runtime(spec, plan)
after_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"params": dims.params, "grew": (after_kib - before_kib) * 1024,
                  "arena": rt.host_memory().arena_bytes}))
"""


def test_building_from_scratch_holds_no_fp32_model() -> None:
    spec = _spec("working_set", {"hf_config": HF_CONFIG}, "bf16")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, spec.model_dump_json()],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    got = json.loads(out.stdout.splitlines()[-1])
    weights_bytes, fp32_model_bytes = 2 * got["params"], 4 * got["params"]
    assert got["arena"] > 3 * weights_bytes  # the whole state is mapped ...
    # ... and its bf16 weights written in; beside them on the CPU the runtime's "device"
    # buffers (0.15 GB here), where a whole fp32 model and its copy took 0.55 GB
    extra = got["grew"] - weights_bytes
    assert extra < fp32_model_bytes / 2, (extra, got)
