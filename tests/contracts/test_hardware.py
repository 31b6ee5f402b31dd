"""A node as one of several jobs packed on one GPU sees it: half the link and half the
compute each for two, so the planner predicts a packed job's step about twice as long (two
working-set jobs on one H100 summed 1.01x one alone: bench/RESULTS.md, "Packing")."""

from __future__ import annotations

from dataclasses import replace

from wstrain.contracts.hardware import H200, LayerTimes
from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan


def test_two_jobs_share_the_link_and_the_compute() -> None:
    node = H200.with_layer(LayerTimes(8192, 0.01, 0.02, 0.004, 0.006))
    half = node.shared_by(2)
    assert half.h2d_bytes_per_s == node.h2d_bytes_per_s / 2
    assert half.both_bytes_per_s == node.both_bytes_per_s / 2
    assert half.matmul_flops == node.matmul_flops / 2
    assert half.attention_flops(8192) == node.attention_flops(8192) / 2
    assert half.layer is not None and half.layer.forward_s == 0.02
    assert half.device_total_bytes == node.device_total_bytes  # budgets, not shares
    assert node.shared_by(1) is node


def test_a_packed_working_set_job_is_planned_about_twice_as_long() -> None:
    dims = replace(PRESETS["llama3-8b"], num_layers=8)
    spec = JobSpec.model_validate(
        {
            "name": "packed",
            "model": {"preset": "llama3-8b"},
            "data": {"kind": "synthetic"},
            "seq_len": 8192,
            "global_batch": 32,
            "steps": 10,
            "budget": {"device_gib": 20, "host_gib": 100},
            "overrides": {"runtime": "working_set"},
        }
    )
    alone = make_plan(spec, dims, H200).predicted.step_seconds
    packed = make_plan(spec, dims, H200.shared_by(2)).predicted.step_seconds
    assert 1.8 < packed / alone < 2.2, (alone, packed)
