"""Long context by pieces (working_set/sequence_chunks.py, seq_chunk) against Hugging Face
`LlamaForCausalLM`: the same loss and every gradient (fp32, relative L2 < 1e-5) for pieces
that do and do not divide the sequence, every saved-activation level, on the device or sent
home; evaluation too; and after steps the weights equal the whole-sequence plan's.

    pytest tests/worker/runtime/working_set/test_sequence_chunks.py
"""

from __future__ import annotations

import functools
import weakref

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from tests.worker.hf_models import hub_grads
from tests.worker.runtime.working_set.reference_runs import (
    DIMS,
    LAYOUTS,
    QWEN3,
    SEQ,
    Batches,
    DocBatches,
    check_grads,
    fp32_spec,
    make_runtime,
    reference,
    rel,
)
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import OptimizerSpec
from wstrain.planning.memory_model import Layout, host_window_bytes, saved_bytes
from wstrain.worker.ops import prefix_attn
from wstrain.worker.ops.host_window import HostWindow
from wstrain.worker.runtime.working_set.config import WorkingSetConfig
from wstrain.worker.runtime.working_set.saved_acts import (
    BackwardPrefetch,
    HostCopy,
    SavedTensorPolicy,
)
from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime
from wstrain.worker.runtime.working_set.state import HostState


@pytest.mark.parametrize("seq_chunk", [4, 5, 1], ids=lambda n: f"piece{n}")
@pytest.mark.parametrize("level", [0, 1, 2, 3])
@pytest.mark.parametrize("window", [0, 2])
def test_pieces_match_transformers(seq_chunk: int, level: int, window: int) -> None:
    check_pieces(DIMS, seq_chunk, level, window)


def check_pieces(dims: ModelDims, seq_chunk: int, level: int, window: int) -> None:
    """Two rounds of 4 sequences, chunks of 2, every (layer, unit) at `level`, through
    pieces of `seq_chunk`: the loss and every gradient of transformers' model."""
    rt = pieces_runtime(dims, seq_chunk, level, window)
    pieces = -(-SEQ // seq_chunk)
    assert rt.cfg.pieces == pieces and rt.cfg.units == 2 * pieces
    check_grads(rt, Batches(dims.vocab_size))


def pieces_runtime(
    dims: ModelDims, seq_chunk: int, level: int, window: int, **kw: object
) -> WorkingSetRuntime:
    """Two rounds of 4 sequences on reference(dims), chunks of 2, every (layer, unit) at
    `level`, in pieces of `seq_chunk`; `kw`: more of make_runtime's."""
    pieces = -(-SEQ // seq_chunk)
    levels = tuple((level,) * 2 * pieces for _ in range(dims.num_layers))
    return make_runtime(
        reference(dims), dims=dims, micro_batch=4, chunk=2, rounds=2, window=window,
        levels=levels, loss_tokens=7, seq_chunk=seq_chunk, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("seq_chunk", [4, 5], ids=lambda n: f"piece{n}")
@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_pieces_with_the_window_home_match_transformers(
    seq_chunk: int, level: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window of K and V with its gradient sums kept on the host and staged a key
    block at a time (ops/host_window.py): blocks of 3 keys, so a piece's prefix comes in
    several blocks and a backward's blocks straddle pieces (5: pieces not dividing the
    sequence, a backward block longer than a prefix block)."""
    monkeypatch.setattr(prefix_attn, "ATTENTION_KEY_BLOCK_TOKENS", 3)
    rt = pieces_runtime(DIMS, seq_chunk, level, 1, window_home=True)
    pieces = -(-SEQ // seq_chunk)
    assert isinstance(rt.pieces.win, HostWindow)  # type: ignore[union-attr]
    # in the host arena, as the planner counts it (a window of chunk=2 sequences here)
    lay = Layout(4, seq_chunk=seq_chunk, pieces=pieces, window_home=True)
    want = 2 * host_window_bytes(DIMS, fp32_spec(global_batch=8), lay)
    assert rt.host.arena.bytes_by_kind["window"] == want
    check_grads(rt, Batches(DIMS.vocab_size))


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_qwen3_pieces_match_transformers(level: int) -> None:
    """Qwen3's per-head q/k RMSNorm goes through pieces too: in the forward's projections
    and again in the window's rebuild of K from each piece's input (pieces of 5 tokens, not
    dividing the sequence)."""
    check_pieces(QWEN3, 5, level, 1)


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_home_sets_take_what_the_planner_counts(level: int) -> None:
    """What a round of pieces sends home is what the planner counts a (layer, piece) for
    the host budget (memory_model.saved_bytes with seq_chunk), within the store's rounding of
    each tensor to 256 bytes; the inputs fetched twice are stored once."""
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    levels = tuple((level,) * 4 for _ in range(DIMS.num_layers))
    rt = make_runtime(ref, micro_batch=1, chunk=1, rounds=1, window=0, levels=levels, seq_chunk=4)
    rt.forward_backward(data, 0)
    spec = fp32_spec(global_batch=1)
    sets = DIMS.num_layers * 4
    want = sets * saved_bytes(DIMS, spec, level, 4)
    tensors = 1 + 2 * (level in (1, 3)) + 2 * (level in (2, 3))
    assert want <= rt.acts.peak_bytes < want + sets * tensors * 256


def one_sequence_in_pieces(
    level: int, seq_chunk: int, cap_bytes: int, **kw: object
) -> tuple[WorkingSetRuntime, Batches]:
    """A round of one sequence through pieces of `seq_chunk`, every set home at `level`
    (no window), under a backward prefetch cap of `cap_bytes`; `kw`: more of make_runtime's."""
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    levels = tuple((level,) * -(-SEQ // seq_chunk) for _ in range(DIMS.num_layers))
    rt = make_runtime(
        ref,
        micro_batch=1,
        chunk=1,
        rounds=1,
        window=0,
        levels=levels,
        seq_chunk=seq_chunk,
        write_buffer_bytes=cap_bytes,
        **kw,
    )
    return rt, data


def record_sends(rt: WorkingSetRuntime) -> list[weakref.ref[HostCopy]]:
    """Every set the runtime's layers send home from now on, as weak references (a copy
    gone is a copy freed)."""
    made: list[weakref.ref[HostCopy]] = []
    policy_of = rt._policy

    def recording(layer: int) -> SavedTensorPolicy:
        policy = policy_of(layer)
        send = policy.send_home

        def send_home(t: torch.Tensor, fp8: bool = True) -> HostCopy:
            copy = send(t, fp8)
            made.append(weakref.ref(copy))
            return copy

        policy.send_home = send_home  # type: ignore[method-assign]
        return policy

    rt._policy = recording  # type: ignore[method-assign]
    return made


@pytest.mark.parametrize("level", [0, 3])
def test_backward_holds_no_more_sets_than_the_prefetch_cap(level: int) -> None:
    """Through a backward of 16 pieces a layer, the saved sets back on the device are at
    most the prefetch's cap and the piece being computed: each set's device copy goes when
    its piece's backward ends, also where it was fetched on demand (a cap smaller than a
    set makes every large tensor on demand), and none is held by the forward's last one.
    Before, a layer's sets piled up until the layer ended: at 512K, 128 pieces' sets, 37
    GiB past a 24 GiB budget on an H100."""
    cap = 200
    rt, data = one_sequence_in_pieces(level, 1, cap)
    made, backward, held = record_sends(rt), rt._backward_layer, []

    def counted(*args, **kw):  # type: ignore[no-untyped-def]
        dx = backward(*args, **kw)
        copies = (ref() for ref in made)
        held.append(sum(c.device.nbytes for c in copies if c is not None and c.device is not None))
        return dx

    rt._backward_layer = counted  # type: ignore[method-assign]
    rt.forward_backward(data, 0)
    one_set = saved_bytes(DIMS, fp32_spec(global_batch=1), level, 1)
    assert len(held) == DIMS.num_layers * SEQ
    assert max(held) <= cap + one_set, (max(held), one_set)  # the cap and the unit's own


@pytest.mark.parametrize("level", [0, 1])
@pytest.mark.parametrize("cap_inputs", [1, 4, SEQ, 2 * SEQ])
def test_inputs_the_rebuild_has_in_flight_are_not_fetched_again(
    level: int, cap_inputs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A piece's input in flight for the window's rebuild when its backward entry comes up
    stays on the device for that backward: with a cap of one input up to a layer's inputs
    and more, backward fetches nothing on demand, and the inputs the rebuild kept cross the
    link once. Before, every such input was let go and fetched again on the compute stream:
    with a cap of a layer's inputs (1 GiB, 16 pieces of 128K tokens), all of them, up to
    1 GiB a layer copied with the GPU idle, which no stall counter saw."""
    x_bytes = saved_bytes(DIMS, fp32_spec(global_batch=1), 0, 1)
    rt, data = one_sequence_in_pieces(level, 1, cap_inputs * x_bytes)
    started: list[HostCopy] = []
    start = BackwardPrefetch._start

    def counted(self: BackwardPrefetch, copy: HostCopy) -> None:
        started.append(copy)
        start(self, copy)

    monkeypatch.setattr(BackwardPrefetch, "_start", counted)
    rt.forward_backward(data, 0)
    assert rt.counters["h2d_on_demand_bytes"] == 0
    if level == 0 and cap_inputs >= SEQ:  # a layer's inputs all ahead: each crosses once
        assert len(started) == len({id(c) for c in started}) == DIMS.num_layers * SEQ


@pytest.mark.parametrize("level", [0, 1, 3])
@pytest.mark.parametrize("cap", [768, 1536, 3072])
def test_kept_fp8_inputs_count_decoded_against_the_cap(level: int, cap: int) -> None:
    """fp8 saved inputs double on the device when decoded: an input kept from the rebuild
    for its backward counts at its decoded bytes, so what the prefetch holds after each
    rebuild stays within the cap. Counted at its bytes on the link, the kept inputs held up
    to twice the cap (1,536 bytes against 768 at level 0)."""
    rt, data = one_sequence_in_pieces(level, 8, cap, precision="bf16", activation_precision="fp8")
    made, rebuild, held, in_fp8 = record_sends(rt), rt._rebuild_window, [], []

    def counted(*args, **kw):  # type: ignore[no-untyped-def]
        rebuild(*args, **kw)
        copies = [ref() for ref in made]
        in_fp8.extend(c.fp8 is not None for c in copies if c is not None)
        held.append(
            sum(c.device.nbytes for c in copies if c and c.device is not None and not c.used)
        )

    rt._rebuild_window = counted  # type: ignore[method-assign]
    rt.forward_backward(data, 0)
    assert any(in_fp8)  # the inputs went home in fp8
    assert len(held) == DIMS.num_layers and max(held) <= cap, (held, cap)
    assert rt.counters["h2d_on_demand_bytes"] == 0


def test_eval_and_steps_equal_whole_sequences() -> None:
    """Three optimizer steps and an evaluation with pieces of 6 tokens give the weights and
    the loss of the plan that runs whole sequences."""
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    runs = []
    for seq_chunk in (0, 6):
        rt = make_runtime(ref, micro_batch=2, chunk=1, rounds=2, window=1, seq_chunk=seq_chunk)
        losses = [rt.train_step(data, step).loss for step in range(3)]
        x, y = data.batch(5, 0, 3)
        runs.append((losses, rt.eval_loss(x, y), rt.state_tensors()))
    (l0, e0, w0), (l1, e1, w1) = runs
    assert all(abs(a - b) < 1e-5 * abs(a) for a, b in zip(l0, l1)), (l0, l1)
    assert abs(e0 - e1) < 1e-5 * abs(e0)
    for name, t in w0.items():
        assert rel(w1[name], t) < 1e-5, name


def test_eval_of_a_partial_chunk_in_pieces() -> None:
    """Chunks of two sequences, an evaluation of three: its last chunk holds one sequence,
    fewer than the context window's batch."""
    ref, data = reference(DIMS), Batches(DIMS.vocab_size)
    x, y = data.batch(5, 0, 3)
    losses = [
        make_runtime(ref, micro_batch=2, chunk=2, rounds=1, seq_chunk=n).eval_loss(x, y)
        for n in (0, 5)
    ]
    assert abs(losses[0] - losses[1]) < 1e-5 * abs(losses[0]), losses


def _each_document_alone(ref: LlamaForCausalLM, data: DocBatches, rounds: int, mb: int) -> float:
    """The step's mean loss with every document run alone through transformers (positions
    from 0, nothing before it); its gradients left in ref."""
    ref.zero_grad()
    total = 0.0
    for r in range(rounds):
        x, y = data.batch(0, r, mb)
        loss = torch.zeros(())
        for b, i in enumerate(data._rows(0, r, mb)):
            at = 0
            for m in LAYOUTS[i % len(LAYOUTS)]:
                logits = ref(input_ids=x[b : b + 1, at : at + m]).logits[0]  # (m, V)
                loss = loss + F.cross_entropy(logits, y[b, at : at + m], reduction="sum")
                at += m
        loss = loss / (rounds * mb * SEQ)
        loss.backward()
        total += loss.item()
    return total


@functools.cache
def _documents_alone_once(rounds: int, mb: int) -> tuple[float, dict[str, torch.Tensor]]:
    """_each_document_alone on reference(DIMS) and DocBatches, run once per test process
    (every piece size and level compares against the same step): (loss, Hub gradients)."""
    rng = torch.get_rng_state()
    ref = reference(DIMS)
    torch.set_rng_state(rng)  # a cached run leaves the global RNG as it found it
    loss = _each_document_alone(ref, DocBatches(DIMS.vocab_size), rounds, mb)
    return loss, {n: g.detach().clone() for n, g in hub_grads(ref).items()}


@pytest.mark.parametrize("seq_chunk", [4, 5], ids=lambda n: f"piece{n}")
@pytest.mark.parametrize("level", [0, 1, 3])
def test_pieces_of_packed_documents_match_each_document_in_transformers(
    seq_chunk: int, level: int
) -> None:
    """document_mask with pieces: every document attends within itself only, across the
    pieces it spans (ops/document_attn.py), with positions from its start: the loss and
    every gradient of transformers running each document alone (fp32, 1e-5)."""
    data = DocBatches(DIMS.vocab_size)
    rt = pieces_runtime(DIMS, seq_chunk, level, 2, document_mask=True)
    want, want_grads = _documents_alone_once(2, 4)
    got = rt.forward_backward(data, 0)
    assert abs(got - want) < 1e-5 * abs(want), (got, want)
    grads = rt.host.named_grads()
    for name, want_g in want_grads.items():
        assert rel(grads[name], want_g) < 1e-5, name


def test_eval_of_packed_documents_in_pieces_equals_whole_sequences() -> None:
    ref, data = reference(DIMS), DocBatches(DIMS.vocab_size)
    x, y = data.batch(5, 0, 3)
    docs = data.documents(5, 0, 3)
    losses = [
        make_runtime(
            ref, micro_batch=2, chunk=2, rounds=1, seq_chunk=n, document_mask=True
        ).eval_loss(x, y, docs)
        for n in (0, 5)
    ]
    assert abs(losses[0] - losses[1]) < 1e-5 * abs(losses[0]), losses


def test_pieces_refuse_what_they_do_not_run() -> None:
    common = dict(
        precision="fp32",
        device="cpu",
        micro_batch=2,
        chunk=1,
        rounds=2,
        steps=1,
        seed=0,
        seq_len=SEQ,
        seq_chunk=4,
    )
    with pytest.raises(ValueError, match="lead_rounds"):
        WorkingSetConfig(**common, lead_rounds=2)  # type: ignore[arg-type]
    assert WorkingSetConfig(**{**common, "seq_chunk": SEQ}).pieces == 1  # type: ignore[arg-type]


class LongBatches:
    """Four sequences of a learnable rule (the next token is 5·t + 3 mod V, one in eight
    tokens random); batch(step, round, n) as TokenStream."""

    def __init__(self, vocab: int, seq: int) -> None:
        g = torch.Generator().manual_seed(3)
        rows = torch.randint(0, vocab, (4, seq + 1), generator=g)
        keep = torch.rand(4, seq + 1, generator=g) < 0.875
        for i in range(1, seq + 1):
            rows[:, i] = torch.where(keep[:, i], (5 * rows[:, i - 1] + 3) % vocab, rows[:, i])
        self.pool = rows
        self.seq_len = seq

    def batch(self, step: int, round_idx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.pool[(step + round_idx) % 4 : (step + round_idx) % 4 + n]
        return rows[:, :-1], rows[:, 1:]

    def target_tokens(self, step: int, sequences: int) -> int:
        return sequences * self.seq_len


def _train(
    dims: ModelDims,
    precision: str,
    device: str,
    steps: int,
    lr: float,
    level: int = 0,
    seq_len: int = 4096,
    **cfg: object,
) -> list[tuple[list[float], dict[str, torch.Tensor]]]:
    """`steps` steps on LongBatches of `seq_len` tokens from the same random weights, whole
    sequences and then in pieces of cfg's seq_chunk, every (layer, unit) at `level`:
    (losses, final weights) of each."""
    data = LongBatches(dims.vocab_size, seq_len)
    torch.manual_seed(0)
    init = HostState.create(dims, "fp32", pin=False)
    state = {k: torch.randn_like(v) * 0.05 for k, v in init.weight_views().items()}
    runs = []
    for seq_chunk in (0, cfg.pop("seq_chunk")):
        cuda = device == "cuda"
        host = HostState.create(dims, precision, pin=cuda, fused_adamw=cuda)
        host.load_state_dict(state)
        config = WorkingSetConfig(
            precision=precision, device=device, micro_batch=1, chunk=1, steps=steps, seed=0,
            seq_len=seq_len, window=1, seq_chunk=seq_chunk, **cfg,  # type: ignore[arg-type]
            levels=((level,) * (seq_len // (seq_chunk or seq_len)),) * dims.num_layers,
        )  # fmt: skip
        rt = WorkingSetRuntime(dims, config, OptimizerSpec(lr=lr, warmup_steps=2), host)
        runs.append(([rt.train_step(data, s).loss for s in range(steps)], rt.state_tensors()))
    return runs


def test_tiny_llama_20_steps_at_1024_tokens_in_pieces_of_128() -> None:
    """A tiny Llama trained 20 steps on 1024-token sequences with pieces of 128 follows the
    whole-sequence run: every step's loss and the final weights (fp32).

    Eight pieces a sequence, each attending to the K and V of every piece before it, and
    four loss blocks of 256 tokens, as at 4096 tokens in pieces of 512 with blocks of 1,024:
    the same pieces and blocks at a quarter of the tokens, a sixteenth of the attention
    (7 s on one CPU thread against 114 s). Over the 20 steps the loss falls 1.37 (4.58 to
    3.20) and the runs stay within 1.2e-7 of each other in loss and 3.2e-6 in weights, under
    the 1e-5 bound; at 2048 tokens in pieces of 256, 1.9e-6."""
    dims = ModelDims(97, 32, 64, 2, 4, 2, 8, 1e-5, 500000.0, 4096)
    (l0, w0), (l1, w1) = _train(
        dims, "fp32", "cpu", 20, 2e-2, seq_len=1024, seq_chunk=128, rounds=1, loss_tokens=256
    )
    assert l0[-1] < l0[0] - 0.2, l0  # it learns
    for a, b in zip(l0, l1):
        assert abs(a - b) < 1e-5 * abs(a), (l0, l1)
    for name, t in w0.items():
        assert rel(w1[name], t) < 1e-5, name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("head_dim", [64, 128], ids=lambda d: f"hd{d}")
@pytest.mark.parametrize("level", [0, 1])
def test_pieces_on_cuda_follow_whole_sequences(level: int, head_dim: int) -> None:
    """bf16 on the GPU (pinned host copies, streams; at head dim 64 cuDNN's prefix and
    diagonal attention, at 128 FlashAttention-3's where its wheel runs, for pieces and whole
    sequences alike): three steps of 4096-token sequences in pieces of 1024 give the losses
    of whole sequences within bf16's rounding."""
    dims = ModelDims(1000, 4 * head_dim, 512, 2, 4, 2, head_dim, 1e-5, 500000.0, 4096)
    whole, pieces = _train(dims, "bf16", "cuda", 3, 1e-3, level, seq_chunk=1024, rounds=2)
    assert all(abs(a - b) < 1e-2 * abs(a) for a, b in zip(whole[0], pieces[0])), (whole, pieces)
