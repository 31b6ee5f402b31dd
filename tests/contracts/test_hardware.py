"""A node as one of several jobs packed on one GPU sees it: half the link and half the
compute each for two, so the planner predicts a packed job's step about twice as long (two
working-set jobs on one H100 summed 1.01x one alone: bench/RESULTS.md, "Packing")."""

from __future__ import annotations

from dataclasses import replace

from tests.helpers.specs import working_set_spec
from wstrain.contracts.hardware import H200, LayerTimes
from wstrain.contracts.model_dims import PRESETS
from wstrain.planning.planner import make_plan


def test_two_jobs_share_the_link_and_the_compute() -> None:
    node = H200.with_layer(LayerTimes(8192, 0.01, 0.02, 0.004, 0.006))
    half = node.shared_by(2)
    assert half.h2d_bytes_per_s == node.h2d_bytes_per_s / 2
    assert half.both_bytes_per_s == node.both_bytes_per_s / 2
    assert half.matmul_flops == node.matmul_flops / 2
    assert half.attention_flops(8192) == node.attention_flops(8192) / 2
    assert half.loss_logits_per_s == node.loss_logits_per_s / 2
    assert half.layer is not None and half.layer.forward_s == 0.02
    assert half.device_total_bytes == node.device_total_bytes  # budgets, not shares
    assert node.shared_by(1) is node


def test_a_packed_working_set_job_is_planned_about_twice_as_long() -> None:
    dims = replace(PRESETS["llama3-8b"], num_layers=8)
    spec = working_set_spec(dims, 8192, 32, 20, 100)
    alone = make_plan(spec, dims, H200).predicted.step_seconds
    packed = make_plan(spec, dims, H200.shared_by(2)).predicted.step_seconds
    assert 1.8 < packed / alone < 2.2, (alone, packed)


def test_the_loss_over_the_logits_is_planned_at_the_measured_rate() -> None:
    """A node that measured the loss's rate plans each step longer by the step's logits over
    it, in compute (an H200 took 0.11 s for 65,536 tokens over 128,256 words, unplanned
    before: the 4-layer rows were predicted 15% short, bench/RESULTS.md "Queue"); a node
    that did not (rate 0) plans as before."""
    dims = replace(PRESETS["llama3-8b"], num_layers=4)
    spec = working_set_spec(dims, 8192, 8, 24, 100)
    rate = 7.6e10
    logits = spec.global_batch * spec.seq_len * dims.vocab_size
    # both runtimes compute the loss alike, so both planners charge it: a term in one only
    # tipped a CPU job from the working set to the resident runtime
    resident = working_set_spec(dims, 8192, 8, 40, 100, runtime="resident")  # 31.7 GiB
    for job in (spec, resident):
        without = make_plan(job, dims, H200)
        with_loss = make_plan(job, dims, replace(H200, loss_logits_per_s=rate))
        assert with_loss.runtime == without.runtime == job.overrides.runtime
        assert with_loss.working_set == without.working_set  # the same plan, with the loss
        extra = with_loss.predicted.compute_seconds - without.predicted.compute_seconds
        assert abs(extra - logits / rate) < 1e-9, (job.overrides.runtime, extra, logits / rate)
        assert 0.10 < extra < 0.12
