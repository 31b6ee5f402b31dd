"""The working-set runtime against Hugging Face `LlamaForCausalLM` (and `Qwen3ForCausalLM`
and three MoE models): same weights, same batch -> same loss and every gradient (fp32,
relative L2 < 1e-5) for every saved-activation level, window, ring size and number of
rounds; after N steps the weights match torch AdamW on the reference; and a property test:
the result never depends on the plan. The models, data and cached reference results:
reference_runs.py."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.worker.hf_models import hub_state
from tests.worker.runtime.working_set.reference_runs import (
    BIG_VOCAB,
    DIMS,
    OLMOE,
    QWEN2_MOE,
    QWEN3,
    QWEN3_MOE,
    Batches,
    check_grads,
    check_weights_after_steps,
    fp32_spec,
    make_runtime,
    reference,
    rel,
)
from wstrain.contracts.model_dims import ModelDims
from wstrain.planning.memory_model import saved_bytes
from wstrain.worker.runtime.optim import make_adamw


@pytest.mark.parametrize("level", [0, 1, 2, 3])
@pytest.mark.parametrize("window", [0, 2, 4])
def test_every_level_and_window_matches_transformers(level: int, window: int) -> None:
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    levels = tuple((level,) * 2 for _ in range(DIMS.num_layers))
    rt = make_runtime(
        ref,
        micro_batch=4,
        chunk=2,
        rounds=2,
        r_param=3,
        r_grad=2,
        window=window,
        levels=levels,
        loss_tokens=24,
    )
    check_grads(rt, data)


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_home_sets_take_what_the_planner_counts(level: int) -> None:
    """What a round sends home is, byte for byte, what the planner counts for the host
    budget (planning/cost_model.py saved_bytes), so the arena holds no more than it
    planned (working_set/saved_acts.py packs the sets within a chunk of that)."""
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    levels = tuple((level,) * 2 for _ in range(DIMS.num_layers))
    rt = make_runtime(
        ref,
        micro_batch=2,
        chunk=1,
        rounds=1,
        r_param=3,
        r_grad=2,
        window=0,
        levels=levels,
        loss_tokens=24,
    )
    rt.forward_backward(data, 0)
    spec = fp32_spec(global_batch=2)
    assert rt.acts.peak_bytes == DIMS.num_layers * 2 * saved_bytes(DIMS, spec, level)


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_qwen3_matches_transformers_through_the_working_set(level: int) -> None:
    ref, data = reference(QWEN3), Batches(QWEN3.vocab_size)
    levels = tuple((level, 3 - level) for _ in range(QWEN3.num_layers))
    rt = make_runtime(
        ref,
        dims=QWEN3,
        micro_batch=4,
        chunk=2,
        rounds=2,
        r_param=2,
        r_grad=1,
        window=1,
        levels=levels,
        loss_tokens=20,
    )
    check_grads(rt, data)


@pytest.mark.parametrize(
    "dims", [OLMOE, QWEN3_MOE, QWEN2_MOE], ids=["olmoe", "qwen3_moe", "qwen2_moe"]
)
@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_moe_matches_transformers_through_the_working_set(dims: ModelDims, level: int) -> None:
    """Routing, experts and the load-balancing loss (coupled over every layer and chunk of a
    round) give the reference's loss and gradients at every level, over two rounds."""
    ref, data = reference(dims), Batches(dims.vocab_size)
    levels = tuple((level, 3 - level) for _ in range(dims.num_layers))
    rt = make_runtime(
        ref,
        dims=dims,
        micro_batch=4,
        chunk=2,
        rounds=2,
        r_param=2,
        r_grad=1,
        window=1,
        levels=levels,
        loss_tokens=20,
    )
    check_grads(rt, data)


@pytest.mark.parametrize(
    "device_layers", [0, 4, 2], ids=["host-adamw", "device-adamw", "split-adamw"]
)
def test_eval_loss_matches_transformers_after_steps(device_layers: int) -> None:
    """The held-out forward (no saving, streamed layers, chunked head) gives the reference
    model's loss on the weights the runtime has reached, a deferred device update included."""
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    rt = make_runtime(
        ref,
        micro_batch=2,
        chunk=1,
        rounds=1,
        r_param=2,
        r_grad=1,
        window=1,
        device_opt_layers=device_layers,
        loss_tokens=11,
    )
    for step in range(2):
        rt.train_step(data, step)
    x, y = data.batch(9, 0, 5)
    got = rt.eval_loss(x, y)
    ref.load_state_dict(rt.state_tensors())
    with torch.no_grad():
        logits = ref(input_ids=x).logits
        want = float(
            torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        )
    assert abs(got - want) < 1e-5 * abs(want)
    rt.train_step(data, 2)  # training goes on after an evaluation


@pytest.mark.parametrize("r_param,r_grad,rounds", [(2, 1, 1), (2, 1, 3), (4, 4, 2), (5, 3, 1)])
def test_ring_sizes_and_rounds_match_transformers(r_param: int, r_grad: int, rounds: int) -> None:
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    levels = tuple(
        tuple(lv)
        for lv in itertools.islice(
            itertools.cycle([(0, 3), (1, 2), (2, 1), (3, 0)]), DIMS.num_layers
        )
    )
    rt = make_runtime(
        ref,
        micro_batch=2,
        chunk=1,
        rounds=rounds,
        r_param=r_param,
        r_grad=r_grad,
        window=1,
        levels=levels,
    )
    check_grads(rt, data)


@pytest.mark.parametrize(
    "device_layers", [0, 4, 2], ids=["host-adamw", "device-adamw", "split-adamw"]
)
def test_weights_after_steps_match_torch_adamw(device_layers: int) -> None:
    dims = BIG_VOCAB if device_layers else DIMS
    ref, data = reference(dims), Batches(dims.vocab_size)
    rt = make_runtime(
        ref,
        dims=dims,
        micro_batch=2,
        chunk=1,
        rounds=2,
        r_param=2,
        r_grad=1,
        window=1,
        device_opt_layers=device_layers,
    )
    check_weights_after_steps(rt, data, 4, 1e-5)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
            ],
        ),
    ],
)
def test_mixed_precision_steps_an_fp32_master_as_torch_adamw(device: str) -> None:
    """precision "mixed": bf16 weights and gradients cross the link, an fp32 master and fp32
    moments take the update on the host. After three steps the master equals torch's AdamW
    stepping an fp32 copy of the starting weights on the runtime's own bf16 gradients,
    widened, clipped and scheduled alike, and the bf16 tiles are the master rounded."""
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    rt = make_runtime(
        ref,
        device,
        precision="mixed",
        micro_batch=2,
        chunk=1,
        rounds=2,
        r_param=2,
        r_grad=1,
        window=1,
    )
    master = {n: t.detach().clone().requires_grad_() for n, t in hub_state(ref).items()}
    opt, sched = make_adamw(master.values(), rt.opt_spec, rt.cfg.steps)
    for step in range(3):
        rt.train_step(data, step)  # its update runs in a thread that only reads the bf16 tiles
        grads = rt.host.named_grads()
        for name, p in master.items():
            assert grads[name].dtype == torch.bfloat16
            p.grad = grads[name].float()
        torch.nn.utils.clip_grad_norm_(master.values(), rt.opt_spec.grad_clip)
        opt.step()
        sched.step()
    weights = rt.state_tensors()
    for name, p in master.items():
        assert weights[name].dtype == torch.float32
        assert rel(weights[name], p.detach()) < 1e-5, name
    for (tile, _), fp32 in zip(rt.host.groups, rt.host.master):
        assert torch.equal(tile, fp32.to(torch.bfloat16))


@pytest.mark.parametrize(
    "device_layers", [0, 4, 2], ids=["host-adamw", "device-adamw", "split-adamw"]
)
def test_lead_pass_matches_torch_adamw(device_layers: int) -> None:
    """A first pass carrying two rounds' sequences; the window layer keeps level 3 for its
    own round's chunks and sends the lead pass's extra chunks home at level 1."""
    dims = BIG_VOCAB if device_layers else DIMS
    ref, data = reference(dims), Batches(dims.vocab_size)
    levels = tuple(((2, 0) if k % 2 else (1, 3)) for k in range(dims.num_layers - 1))
    rt = make_runtime(
        ref,
        dims=dims,
        micro_batch=2,
        chunk=1,
        rounds=3,
        r_param=2,
        r_grad=1,
        window=1,
        levels=(*levels, (3, 3)),
        device_opt_layers=device_layers,
        lead_rounds=2,
    )
    assert rt.cfg.placement(dims.num_layers - 1, 3, dims.num_layers) == (1, True)
    check_weights_after_steps(rt, data, 3, 1e-5)


@settings(max_examples=20, deadline=None)
@given(
    mb_chunk=st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (4, 1)]),
    rounds=st.integers(1, 4),
    lead=st.integers(1, 3),
    r_param=st.integers(2, 5),
    r_grad=st.integers(1, 4),
    window=st.integers(0, 4),
    overlap=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_result_never_depends_on_the_plan(
    mb_chunk: tuple[int, int],
    rounds: int,
    lead: int,
    r_param: int,
    r_grad: int,
    window: int,
    overlap: bool,
    seed: int,
) -> None:
    """Any plan, the cross-round overlap (working_set/pass_order.py) with its first pass's
    own levels included. The examples vary the plan (`seed` draws the levels and the loss
    chunk) over one token pool, so transformers runs each distinct round of it once for
    each number of rounds (reference_runs.reference_step), 30 rounds at most, rather than
    every round of every example."""
    mb, chunk = mb_chunk
    g = torch.Generator().manual_seed(seed)

    def random_levels() -> tuple[tuple[int, ...], ...]:
        return tuple(
            tuple(int(v) for v in torch.randint(0, 4, (mb // chunk,), generator=g))
            for _ in range(DIMS.num_layers)
        )

    levels, first_levels = random_levels(), random_levels() if overlap else ()
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    rt = make_runtime(
        ref,
        micro_batch=mb,
        chunk=chunk,
        rounds=rounds,
        r_param=r_param,
        r_grad=r_grad,
        window=window,
        levels=levels,
        loss_tokens=int(torch.randint(5, 40, (1,), generator=g)),
        lead_rounds=min(lead, rounds),
        overlap=overlap,
        first_levels=first_levels,
    )
    check_grads(rt, data)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("level", [0, 1, 2, 3])
@pytest.mark.parametrize("window", [0, 2])
def test_cuda_streams_match_transformers(level: int, window: int) -> None:
    """The same schedule with real streams, events and pinned host tiles on a GPU."""
    ref = reference(DIMS).cuda()
    gpu_data = Batches(DIMS.vocab_size)
    gpu_data.pool = gpu_data.pool.cuda()
    levels = tuple((level,) * 2 for _ in range(DIMS.num_layers))
    rt = make_runtime(
        ref,
        device="cuda",
        micro_batch=4,
        chunk=2,
        rounds=2,
        r_param=2,
        r_grad=1,
        window=window,
        levels=levels,
        loss_tokens=24,
    )
    check_grads(rt, gpu_data, tol=1e-4, ref=ref)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_cuda_moe_matches_transformers(level: int) -> None:
    """MoE layers with real streams: stashed routing and (levels 1, 3) the attention kernel's
    set sent home and fetched back; OLMoE's q/k norms take the recomputing path."""
    ref = reference(OLMOE).cuda()
    gpu_data = Batches(OLMOE.vocab_size)
    gpu_data.pool = gpu_data.pool.cuda()
    levels = tuple((level,) * 2 for _ in range(OLMOE.num_layers))
    rt = make_runtime(
        ref,
        device="cuda",
        dims=OLMOE,
        micro_batch=4,
        chunk=2,
        rounds=2,
        r_param=2,
        r_grad=1,
        window=1,
        levels=levels,
        loss_tokens=24,
    )
    check_grads(rt, gpu_data, tol=1e-4, ref=ref)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("device_layers", [4, 1], ids=["device-adamw", "split-adamw"])
def test_cuda_device_adamw_matches_torch_adamw(device_layers: int) -> None:
    """The device optimizer with real streams, the embedding (and head) in several slices;
    split: the host thread updates the later layers and the head at the same time."""
    ref = reference(BIG_VOCAB).cuda()
    data = Batches(BIG_VOCAB.vocab_size)
    data.pool = data.pool.cuda()
    rt = make_runtime(
        ref,
        device="cuda",
        dims=BIG_VOCAB,
        micro_batch=2,
        chunk=1,
        rounds=2,
        r_param=2,
        r_grad=1,
        window=1,
        device_opt_layers=device_layers,
        loss_tokens=24,
    )
    check_weights_after_steps(rt, data, 3, 1e-4, ref=ref)


@pytest.mark.parametrize(
    "device_layers,precision",
    [(0, "fp32"), (4, "fp32"), (2, "fp32"), (0, "mixed")],
    ids=["host-adamw", "device-adamw", "split-adamw", "mixed"],
)
def test_checkpoint_mid_run_resumes_bit_identical(device_layers: int, precision: str) -> None:
    """Saving state mid-run (which applies a deferred device update) and loading it into a
    fresh runtime gives exactly the weights of an uninterrupted run (mixed: the fp32
    master is what is saved)."""
    kw = dict(
        micro_batch=2,
        chunk=1,
        rounds=2,
        r_param=2,
        r_grad=1,
        window=1,
        device_opt_layers=device_layers,
        precision=precision,
        levels=tuple((2, 0) for _ in range(DIMS.num_layers)),
    )
    ref = reference(DIMS)
    straight, data = make_runtime(ref, **kw), Batches(DIMS.vocab_size)
    for step in range(4):
        straight.train_step(data, step)
    first = make_runtime(ref, **kw)
    for step in range(2):
        first.train_step(data, step)
    tensors, extra = first.state_tensors(), first.optimizer_state()
    resumed = make_runtime(reference(DIMS), **kw)
    resumed.load_state(tensors, extra)
    for step in range(2, 4):
        resumed.train_step(data, step)
    want, got = straight.state_tensors(), resumed.state_tensors()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_the_next_set_comes_back_while_this_ones_backward_computes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a prefetch cap of about one saved set (a 32K-token sequence's set is 0.94 GB of
    the 1 GiB write buffer), backward tops the prefetch up as it takes each tensor, so the
    next set's copies start inside this one's backward; topped up only between chunks, every
    layer waited for its own set (0.56 s of a 5.4 s step on an H100). Gradients unchanged."""
    from wstrain.worker.runtime.working_set import layer_passes, saved_acts

    spec = fp32_spec(global_batch=2)
    one_set = saved_bytes(DIMS, spec, 1)
    events: list[str] = []
    start, backward = saved_acts.BackwardPrefetch._start, layer_passes.LayerPasses._backward_layer

    def started(self, copy):  # type: ignore[no-untyped-def]
        events.append("copy")
        return start(self, copy)

    def traced(self, *args):  # type: ignore[no-untyped-def]
        events.append("begin")
        out = backward(self, *args)
        events.append("end")
        return out

    monkeypatch.setattr(saved_acts.BackwardPrefetch, "_start", started)
    monkeypatch.setattr(layer_passes.LayerPasses, "_backward_layer", traced)
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    rt = make_runtime(
        ref, micro_batch=2, chunk=1, rounds=1, window=0,
        levels=tuple((1, 1) for _ in range(DIMS.num_layers)),
        write_buffer_bytes=one_set + one_set // 10,
    )  # fmt: skip
    check_grads(rt, data)
    spans = "".join("b" if e == "begin" else "e" if e == "end" else "c" for e in events)
    inside = [part for part in spans.split("b")[1:]]  # each backward call, to the next one
    assert len(inside) == DIMS.num_layers * 2
    # every call but the last starts copies of later sets before it ends
    assert all("c" in part.split("e")[0] for part in inside[:-1]), spans
    assert rt.counters["h2d_on_demand_bytes"] == 0
