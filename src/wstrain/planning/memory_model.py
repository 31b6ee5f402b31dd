"""The working-set memory model: a candidate plan's Layout and the bytes it holds, on the
device (fixed parts, the context window, documents, the window's saved sets, the write
buffer) and on the host (the training state, the saved sets sent home, the reserve), from
the model's dimensions and the job's spec. Calibrated on H200 runs of bench/runtime.py
(Llama-3-8B dims, 8K tokens); the step's time is cost_model.py's.

    fixed_device_bytes(dims, spec, Layout(micro_batch=4), window)   # bytes"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from wstrain.contracts.calibration import (
    ACTIVATION_CHUNK_BYTES,
    ALLOCATOR_SLACK,
    ATTENTION_KEY_BLOCK_TOKENS,
    DEVICE_RESERVE_BYTES,
    DOCUMENT_MASK_BYTES_PER_PAIR,
    ELEMENT_BYTES,
    FP8_BLOCK_ELEMENTS,
    LAYER_WORKSPACE_FACTOR,
    LEVELS,
    WRITE_BUFFER_BYTES,
    host_reserve_bytes,
)
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.spill import host_saved_bytes

OptimizerPlacement = Literal["host", "device", "split"]


@dataclass(frozen=True)
class Layout:
    """The discrete choices of a working-set plan besides window and levels."""

    micro_batch: int  # sequences per round, one chunk each
    r_param: int = 3
    r_grad: int = 2
    # last step's deferred AdamW (working_set/schedule.py): "host", "device" (two moment
    # slots each for m and v) or "split" (the first device_layers layers and the embedding)
    optimizer: OptimizerPlacement = "host"
    loss_tokens: int = 2048  # LM-head token block
    lead_rounds: int = 1  # rounds the step's first pass carries (working_set/schedule.py)
    device_layers: int = 0  # split: 0 until the planner picks it (split_layers)
    # long context (working_set/sequence_chunks.py): piece tokens, pieces; 0 and 1: whole
    seq_chunk: int = 0
    pieces: int = 1
    # cross-round overlap (working_set/pass_order.py): a forward beside the last backward
    overlap: bool = False
    # the disk tier (working_set/spill.py): the last spilled_layers layers' AdamW moments in
    # the spill file, updated by the host through SPILL_SLOTS slots
    spilled_layers: int = 0
    # long context: the pieces' window of K and V with their fp32 gradient sums in pinned
    # host memory, staged a key block at a time (worker/ops/host_window.py)
    window_home: bool = False
    write_buffer_bytes: int = WRITE_BUFFER_BYTES  # saved sets in flight home (device memory)

    @property
    def pass_sequences(self) -> int:
        """Sequences of the passes in flight at once: the first pass's lead rounds, and with
        overlap the next round's beside them."""
        return (self.lead_rounds + self.overlap) * self.micro_batch

    @property
    def units(self) -> int:
        """(sequence, piece) units a round: the saved sets and levels of each layer."""
        return self.micro_batch * self.pieces

    @property
    def device_optimizer(self) -> bool:
        """Moment slots on the device."""
        return self.optimizer != "host"


def activation_bytes_per_token(dims: ModelDims, precision: str) -> int:
    """Bytes autograd saves per token per layer in the resident model: inputs, norm outputs,
    q/k/v, attention output, residual, SwiGLU gate/up/silu/product, fp32 norm copies; a MoE
    layer's k experts add each routed copy of the input and its weighted output, and the
    router's fp32 probabilities."""
    e = ELEMENT_BYTES[precision]
    d, kv = dims.hidden_size, dims.num_kv_heads * dims.head_dim
    q = dims.num_heads * dims.head_dim
    routed = (2 * dims.experts_per_token * d * e + 8 * dims.num_experts) if dims.is_moe else 0
    return e * (4 * d + 2 * q + 2 * kv + 4 * dims.ffn_width) + 8 * d + routed


def saved_bytes(
    dims: ModelDims, spec: JobSpec, level: int, seq_chunk: int = 0, home: bool = True
) -> int:
    """What one (layer, unit) saves at `level` (working_set/schedule.py): its input, at
    levels 1 and 3 the attention kernel's set (q, k, v, output, fp32 log-sum-exp; a piece of
    a long sequence (seq_chunk) saves the output and log-sum-exp only: its q, k and v are
    recomputed with the window), at 2 and 3 the MLP's lean set (gate and up; MoE: per routed
    copy, plus the routing). A unit is a sequence, or a piece of seq_chunk tokens. `home`:
    as sent home; a window layer's sets stay on the device as they are, 16-bit under fp8."""
    return _saved_bytes(
        dims, spec.precision, spec.activation_precision, spec.seq_len, level, seq_chunk, home
    )


def saved_bytes_by_level(
    dims: ModelDims, spec: JobSpec, seq_chunk: int = 0, home: bool = True
) -> list[int]:
    """saved_bytes at each level, 0 to LEVELS - 1 (a new list: the caller's to change)."""
    key = (spec.precision, spec.activation_precision, spec.seq_len, seq_chunk, home)
    return list(_saved_by_level(dims, *key))


# the planner asks for the same few sets at every window and candidate of every layout
@functools.lru_cache(maxsize=4096)
def _saved_by_level(
    dims: ModelDims,
    precision: str,
    activation_precision: str,
    seq_len: int,
    seq_chunk: int,
    home: bool,
) -> tuple[int, ...]:
    return tuple(
        _saved_bytes(dims, precision, activation_precision, seq_len, lv, seq_chunk, home)
        for lv in range(LEVELS)
    )


def _saved_bytes(
    dims: ModelDims,
    precision: str,
    activation_precision: str,
    seq_len: int,
    level: int,
    seq_chunk: int,
    home: bool,
) -> int:
    e_kernel = ELEMENT_BYTES[precision]
    e: float = e_kernel
    if activation_precision == "fp8" and e == 2 and home:
        # 1 byte and a 4-byte scale per block of a 16-bit tensor (working_set/fp8_saves.py);
        # the attention kernel's own set (whole sequences) and the fp32 log-sum-exp stay
        e = 1 + 4 / FP8_BLOCK_ELEMENTS
    hd = dims.head_dim
    if seq_chunk:  # a piece saves the output and log-sum-exp itself
        core = e * dims.num_heads * hd + 4 * dims.num_heads
    else:
        core = e_kernel * 2 * (dims.num_heads + dims.num_kv_heads) * hd + 4 * dims.num_heads
    lean = (
        dims.experts_per_token * (2 * dims.moe_intermediate_size * e + 8)
        if dims.is_moe
        else 2 * dims.intermediate_size * e
    )
    per_token = dims.hidden_size * e + core * (level in (1, 3)) + lean * (level in (2, 3))
    return math.ceil(min(seq_chunk or seq_len, seq_len) * per_token)


def context_window_bytes(dims: ModelDims, spec: JobSpec, lay: Layout) -> int:
    """Device bytes of a long sequence's context window (ops/chunk_attn.py): K and V of the
    whole sequence, their fp32 gradient sums, and one attention backward call's key block
    (ops/prefix_attn.py): its dK, dV, and FA2's copies of them expanded to every query head
    under GQA. 0 without pieces."""
    if lay.pieces == 1:
        return 0
    e = ELEMENT_BYTES[spec.precision]
    width = dims.num_kv_heads * dims.head_dim
    block = min(spec.seq_len, ATTENTION_KEY_BLOCK_TOKENS)
    expanded = dims.num_heads * dims.head_dim * (dims.num_heads != dims.num_kv_heads)
    # on the host: two device slots of a block or a piece (worker/ops/host_window.py)
    rows = 2 * max(block, lay.seq_chunk) if lay.window_home else spec.seq_len
    return rows * width * (2 * e + 2 * 4) + block * 2 * e * (width + expanded)


def host_window_bytes(dims: ModelDims, spec: JobSpec, lay: Layout) -> int:
    """Host bytes of a window kept there (window_home): K, V and their fp32 sums of a chunk's
    one sequence (as context_window_bytes on the device), 12 KiB a token; else 0."""
    if not lay.window_home or lay.pieces == 1:
        return 0
    width = dims.num_kv_heads * dims.head_dim
    return spec.seq_len * width * (2 * ELEMENT_BYTES[spec.precision] + 2 * 4)


def document_bytes(dims: ModelDims, spec: JobSpec, lay: Layout) -> int:
    """Device bytes document_mask adds for a pass: RoPE tables per token (cos and sin,
    (sequences, S, hd) each) and, for whole sequences, the dense (S, S) mask of each; with
    pieces no mask (ops/document_attn.py runs each document's part alone) but one piece's
    queries, output and output gradient copied out per document call. 0 without documents."""
    if not spec.document_mask:
        return 0
    e = ELEMENT_BYTES[spec.precision]
    sequences, S = lay.pass_sequences, spec.seq_len
    tables = 2 * sequences * S * dims.head_dim * e
    if lay.pieces == 1:
        return tables + sequences * S * S * DOCUMENT_MASK_BYTES_PER_PAIR
    return tables + 3 * lay.seq_chunk * dims.num_heads * dims.head_dim * e


def fixed_device_bytes(dims: ModelDims, spec: JobSpec, lay: Layout, window: int) -> int:
    """AdaWS's B: every device byte but the window's saved activations. Tensors allocated
    once at their exact size (embedding, head, slot rings) count as they are; what is
    allocated and freed layer by layer (transition, loss block, workspace, copies in
    flight, the reserve) takes ALLOCATOR_SLACK for the caching allocator's rounding and
    fragmentation. (The window's saved sets, exact and freed in order, take none: slack on
    every byte predicted 1.12-1.25x the H200's reserved peak; bench/RESULTS.md.)"""
    once, moving = _fixed_device_parts(dims, spec, lay)
    return int(once + (moving + _home_in_flight_bytes(dims, spec, lay, window)) * ALLOCATOR_SLACK)


def _fixed_device_parts(dims: ModelDims, spec: JobSpec, lay: Layout) -> tuple[int, int]:
    """fixed_device_bytes but the window's part: (bytes allocated once, moving bytes but the
    copies in flight home), exact integers, so the sum is fixed_device_bytes' to the byte."""
    e = ELEMENT_BYTES[spec.precision]
    S, D = spec.seq_len, dims.hidden_size
    groups = 4 * dims.embedding_params * e + 2 * D * e  # embedding + head, weights + grads
    rings = (lay.r_param + lay.r_grad + 4 * lay.device_optimizer) * dims.layer_params * e
    transition = lay.pass_sequences * S * D * e
    # LM-head block: logits, their fp32 copy and grad (the head's weight gradient
    # accumulates in place: working_set/schedule.py _head_loss)
    loss = min(lay.loss_tokens, S) * dims.vocab_size * (e + 8)
    moving = transition + loss + _layer_temporaries_but_home(dims, spec, lay)
    moving += document_bytes(dims, spec, lay) + DEVICE_RESERVE_BYTES
    moving += context_window_bytes(dims, spec, lay)
    return groups + rings, moving


def layer_temporaries_bytes(dims: ModelDims, spec: JobSpec, lay: Layout, window: int) -> int:
    """Fixed device bytes that only a layer's pass holds (before ALLOCATOR_SLACK): its
    workspace, its weight gradients made whole, and the copies in flight home. Idle while the
    LM head runs: the sets that leave then may sit in them (bench/bound.py)."""
    home = _home_in_flight_bytes(dims, spec, lay, window)
    return _layer_temporaries_but_home(dims, spec, lay) + home


def _layer_temporaries_but_home(dims: ModelDims, spec: JobSpec, lay: Layout) -> int:
    """layer_temporaries_bytes but the copies in flight home, the same at every window."""
    e = ELEMENT_BYTES[spec.precision]
    piece = min(lay.seq_chunk or spec.seq_len, spec.seq_len)  # tokens a layer holds at once
    workspace = int(
        LAYER_WORKSPACE_FACTOR * activation_bytes_per_token(dims, spec.precision) * piece
    )
    # weight gradients whole before they accumulate into the slot: a MoE layer's (without
    # them OLMoE at 12 GiB measured 0.14 GiB over the model); a dense layer's GEMMs
    # accumulate in place (models/blocks.py add_weight_grad), all but the attention block's
    # when levels 0 and 2 recompute it with autograd
    mlp = 0 if dims.is_moe else 3 * dims.hidden_size * dims.intermediate_size
    dw = (dims.layer_params - mlp) * e
    return workspace + dw


def _home_in_flight_bytes(
    dims: ModelDims, spec: JobSpec, lay: Layout, window: int, level3_set: int = 0, cap: int = 0
) -> int:
    """The copies in flight home, at most _in_flight_cap and all the home layers send; with
    overlap the previous pass's sets coming back (as many again) beside them (saved_acts.py
    BackwardPrefetch for the turn to backward). `level3_set`, `cap`: saved_bytes(.., 3,
    lay.seq_chunk) and _in_flight_cap where the caller has them."""
    level3_set = level3_set or saved_bytes(dims, spec, 3, lay.seq_chunk)
    sent = (dims.num_layers - window) * lay.units * level3_set
    return (1 + lay.overlap) * min(cap or _in_flight_cap(dims, spec, lay), sent)


def _in_flight_cap(dims: ModelDims, spec: JobSpec, lay: Layout) -> int:
    """The write buffer, or the largest saved tensor where it outgrows the buffer (it goes
    alone: host_store.admit): a unit's input, q or output, or the MLP's gate or up."""
    width = max(dims.hidden_size, dims.num_heads * dims.head_dim, dims.ffn_width)
    tokens = min(lay.seq_chunk or spec.seq_len, spec.seq_len)
    return max(lay.write_buffer_bytes, tokens * width * ELEMENT_BYTES[spec.precision])


def device_bytes(
    dims: ModelDims, spec: JobSpec, lay: Layout, window: int, window_saved: int
) -> int:
    return fixed_device_bytes(dims, spec, lay, window) + window_saved


def spare_window_bytes(dims: ModelDims, spec: JobSpec, lay: Layout, window: int) -> float:
    """Device bytes left for the window's saved sets beyond their inputs (AdaWS's
    C_dev - B - W·L_bytes with level-0 window layers); negative: W does not fit."""
    base = window * lay.units * saved_bytes(dims, spec, 0, lay.seq_chunk, home=False)
    return spec.budget.device_bytes - fixed_device_bytes(dims, spec, lay, window) - base


def spare_window_bytes_each(
    dims: ModelDims, spec: JobSpec, lay: Layout, windows: Iterable[int]
) -> list[float]:
    """spare_window_bytes at each of `windows`, equal to it to the byte: what does not
    depend on the window (all but the copies in flight home and the window's inputs) is
    counted once, not once a window (the planner asks at every window of every layout)."""
    once, moving = _fixed_device_parts(dims, spec, lay)
    level3_set = saved_bytes(dims, spec, 3, lay.seq_chunk)
    input_set = saved_bytes(dims, spec, 0, lay.seq_chunk, home=False)
    cap = _in_flight_cap(dims, spec, lay)
    out: list[float] = []
    for w in windows:
        home = _home_in_flight_bytes(dims, spec, lay, w, level3_set, cap)
        fixed = int(once + (moving + home) * ALLOCATOR_SLACK)
        out.append(spec.budget.device_bytes - fixed - w * lay.units * input_set)
    return out


def lead_pass_saved(lay: Layout, home_saved: int, window_inputs: int) -> int:
    """Saved bytes a lead pass sends home beyond one round's `home_saved`: its other rounds'
    home sets, and its window chunks past the first round's at level 1 (`window_inputs`)."""
    return (lay.lead_rounds - 1) * (home_saved + window_inputs)


def host_state_bytes(dims: ModelDims, precision: str, spilled: int = 0) -> int:
    """The host tiles (working_set/state.py): weights, gradients and two moments, each of the
    streamed element size; mixed: bf16 weights and gradients, an fp32 master and moments,
    the largest group's fp32 gradient scratch; less what `spilled` layers' moments on disk
    save (planning/spill.py host_saved_bytes: the moments less the spill slots)."""
    if spilled:
        return host_state_bytes(dims, precision) - host_saved_bytes(dims, precision, spilled)
    if precision == "mixed":  # the largest group: a layer, or the head with the final norm
        largest = max(dims.layer_params, dims.embedding_params + dims.hidden_size)
        return 16 * dims.params + 4 * largest
    return 4 * ELEMENT_BYTES[precision] * dims.params


def stored_bytes(saved: int) -> int:
    """Host activation store bytes that hold `saved` bytes of saved sets (its chunking)."""
    return saved + saved // 256 + ACTIVATION_CHUNK_BYTES if saved else 0


def overlap_live_bytes(first: list[int], later: list[int]) -> int:
    """The most saved bytes the host store holds at once with the cross-round overlap
    (working_set/pass_order.py, host_store.py): `first[k]`, `later[k]`: the bytes layer k of
    the step's first pass and of each later pass sends home. A pass's layer i goes home
    while the pass before it still holds its layers 0..L-1-i; each layer's sets are released
    as its backward ends. With equal passes: one pass's sets and a layer's more."""
    L = len(first)

    def beside(behind: list[int], ahead: list[int]) -> int:
        return max(sum(ahead[: i + 1]) + sum(behind[: L - i]) for i in range(L))

    return max(sum(first), beside(first, later), beside(later, later))


def overlap_stored_bytes(
    first: list[int], later: list[int], chunk_bytes: int = ACTIVATION_CHUNK_BYTES
) -> int:
    """Host store bytes with the cross-round overlap: one store shared by the two passes in
    flight, each layer's sets in whole chunks of their own (host_store.py _take_paged), so
    it holds exactly overlap_live_bytes's pages (a property test: test_host_store.py)."""

    def pages(sent: list[int]) -> list[int]:
        return [-(-b // chunk_bytes) for b in sent]

    return chunk_bytes * overlap_live_bytes(pages(first), pages(later))


def home_saved_limit(
    dims: ModelDims, spec: JobSpec, device: str, most: int, lay: Layout, window_inputs: int
) -> int:
    """The most saved bytes a round sends home, up to `most`, whose store fits the host
    budget beside the state, with a lead pass's extra sets (lead_pass_saved); -1 where even
    none fit."""

    def fits(home_saved: int) -> bool:
        extra = lead_pass_saved(lay, home_saved, window_inputs)
        host = host_bytes(dims, spec, home_saved + extra, device, lay=lay)
        return host <= spec.budget.host_bytes

    if fits(most):
        return most
    lo, hi = -1, most
    while lo < hi:  # the largest fitting, by halves: host_bytes is not linear (store chunks)
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(max(mid, 0)) else (lo, mid - 1)
    return lo


def host_bytes(
    dims: ModelDims,
    spec: JobSpec,
    home_saved: int,
    device: str,
    stored: int | None = None,
    lay: Layout | None = None,
) -> int:
    """Training state + the store of saved sets sent home (`stored` bytes where given, as
    overlap_stored_bytes counts them) + the reserve beside the arena; with spec.gpus
    ranks the state is shared, the store and the reserve are each rank's
    (planning/ranks.py); `lay`'s spilled layers' moments on disk, its window on the host."""
    store = stored_bytes(home_saved) if stored is None else stored
    spilled = lay.spilled_layers if lay else 0
    state, reserve = _host_fixed_bytes(dims, spec.precision, device, spilled)
    private = store + reserve + (host_window_bytes(dims, spec, lay) if lay else 0)
    return state + spec.gpus * private


# the planner asks at every candidate of every layout
@functools.lru_cache(maxsize=4096)
def _host_fixed_bytes(
    dims: ModelDims, precision: str, device: str, spilled: int = 0
) -> tuple[int, int]:
    """(host_state_bytes, host_reserve_bytes) of `dims` in `precision` on `device`."""
    state = host_state_bytes(dims, precision, spilled)
    return state, host_reserve_bytes(dims.params, precision, device)
