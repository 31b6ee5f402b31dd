"""The candidates the working-set autoconfigurator (planning/working_set.py) searches: the
micro-batch tiers from AdaWS's bound, and per micro-batch the layouts — ring sizes, where
AdamW runs, the LM-head block, the lead pass, the sequence pieces and the cross-round overlap.

    tiers, bound = micro_batches(spec, dims, node)
    for lay in layouts(spec, dims, tiers[0], pieces=True): ...

Tested through the planner: pytest tests/planning/test_autoconfig.py.
"""

from __future__ import annotations

from wstrain.contracts.calibration import ELEMENT_BYTES, GIB, WRITE_BUFFER_BYTES
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import JobSpec
from wstrain.contracts.step_shape import piece_count
from wstrain.planning import memory_model as mm
from wstrain.planning.layer_time import adaws_min_micro_batch

MAX_MICRO_BATCH = 32  # sequences per round the search considers
MICRO_BATCHES_TRIED = 4  # divisors from the AdaWS bound up
# Piece lengths tried for long context (seq_chunk), beside whole sequences: from 4K, where a
# piece's GEMMs still run near the matmul peak, to 16K; only lengths that divide seq_len.
SEQ_CHUNKS = (4096, 8192, 16384)
# Below this many tokens pieces are planned only when whole sequences fit no budget: at 32K
# on an H100 (24 GiB, 32 layers) whole sequences ran 6.16 K tok/s and pieces of 4K 5.64 K,
# while the cost model, which has no per-piece overhead, predicted pieces 12% too fast.
PIECES_FROM_TOKENS = 65536
# Write buffers tried beside the 1 GiB default for whole sequences whose full saved set
# outgrows it (from ~16K tokens at Llama-3-8B dims: 2.63 GiB at 32K). Such a set cannot be
# prefetched in backward and fills the buffer in forward, so the levels DP recomputes
# instead; the larger buffer costs the device memory it holds (memory_model). At 32K x 8 the
# planner predicts 4 GiB 1.2% faster (bf16 sets), 2 GiB 6.7% (fp8); for pieces (64K-256K)
# at most 0.2%, not worth the search's time.
WRITE_BUFFER_MULTIPLES = (1, 2, 4)
# A larger buffer is taken only where it predicts at least this much faster: its device
# bytes are headroom, and a smaller gain is inside the predictions' error (+-5%).
WRITE_BUFFER_GAIN = 0.01


def micro_batches(
    spec: JobSpec, dims: ModelDims, node: NodeProfile
) -> tuple[list[list[int]], float]:
    """Micro-batch candidates in tiers, and the AdaWS bound: divisors of the global batch at
    or above the bound first (the cost model picks among them), then, only if none fits the
    budget (or the global batch is below the bound), the smaller ones (AdaWS's guards: at
    least one sequence, and fewer tokens where memory demands it)."""
    e = ELEMENT_BYTES[spec.precision]
    bound = adaws_min_micro_batch(
        dims.layer_params,
        dims.layer_params_active,
        spec.seq_len,
        dims.num_heads * dims.head_dim,
        e,
        e,
        node.matmul_flops,
        node.h2d_bytes_per_s,
    )
    if spec.overrides.micro_batch:
        return [[spec.overrides.micro_batch]], bound
    divisors = [
        d
        for d in range(1, min(spec.global_batch, MAX_MICRO_BATCH) + 1)
        if spec.global_batch % d == 0
    ]
    above = [d for d in divisors if d >= bound - 1e-9][:MICRO_BATCHES_TRIED]
    below = [d for d in reversed(divisors) if d < bound - 1e-9]
    return [tier for tier in (above, below) if tier], bound


def layouts(
    spec: JobSpec,
    dims: ModelDims,
    mbs: list[int],
    pieces: bool,
    device: str = "cuda",
    spilled: int = 0,
) -> list[mm.Layout]:
    """Every layout the search costs; with `spilled` layers' moments on disk, only those
    whose host AdamW updates them (no "device" optimizer; a split's device layers come
    before them)."""
    o, L = spec.overrides, dims.num_layers
    rings = (
        [(o.r_param or 3, o.r_grad or 2)] if (o.r_param or o.r_grad) else [(3, 2), (2, 2), (2, 1)]
    )
    # split: the first layers on the device, the rest on the host (working_set._finish picks
    # how many); data parallel ranks update their node's one shared host copy on the host
    # (planning/ranks.py), on one node or several
    optimizers: list[mm.OptimizerPlacement] = (
        [o.optimizer]
        if o.optimizer
        else ["host"]
        if spec.precision == "mixed" or spec.gpus * spec.nodes > 1
        else ["device", "host", "split"]
        if dims.num_layers > 1
        else ["device", "host"]
    )
    # a lead pass of two rounds for dense models (the MoE path is not tested under one)
    leads = [o.lead_rounds] if o.lead_rounds else [1, 2] if not dims.is_moe else [1]
    # cross-round overlap (working_set/pass_order.py) for dense models' whole sequences,
    # where a round follows the first pass. Unless the job pins it, planned beside per round
    # for fp8 saved sets on one CUDA GPU: there the H200 rows ran it faster (0.926x resident
    # at 20 GiB, 0.890x per round). Lossless sets fill the link both ways and ran slower
    # (0.824x and 0.857x against 0.875x) than the cost model's 0.5-6% gain: on request only,
    # as on several GPUs (tested with gloo, not measured) (bench/RESULTS.md, Several GPUs)
    if spilled:
        optimizers = [p for p in optimizers if p == "host" or (p == "split" and spilled < L)]
    chosen = spec.gpus * spec.nodes == 1 and device == "cuda" and spec.activation_precision == "fp8"
    overlaps = [o.overlap] if o.overlap is not None else [False, True] if chosen else [False]
    overlaps = [v for v in overlaps if not (v and dims.is_moe)]
    homes = window_homes(spec, device)
    return [
        mm.Layout(
            m,
            rp,
            rg,
            opt,
            lt,
            lead,
            seq_chunk=c,
            pieces=p,
            overlap=overlap,
            spilled_layers=spilled,
            window_home=home,
            write_buffer_bytes=wb,
        )
        for overlap in overlaps
        for c, p in seq_chunks(spec, dims, pieces)
        if p == 1 or not overlap  # the overlap runs whole sequences
        for wb in write_buffers(spec, dims, c)
        for home in (homes if p > 1 else [False])
        for lead in (leads if p == 1 else [1])  # pieces run one round a pass
        for m in mbs
        for opt in optimizers
        for rp, rg in rings
        for lt in (2048, 512)
        if lead <= spec.global_batch // m
        and (not overlap or lead < spec.global_batch // m)
        # one gradient slot sends a layer's gradients home and fetches the next one's in
        # series: beside a forward's sets on the link the H200's 12 GiB overlap row
        # stalled 2.7 s a step on them
        and not (overlap and rg == 1 and o.r_grad is None)
    ]


def write_buffers(spec: JobSpec, dims: ModelDims, seq_chunk: int) -> list[int]:
    """Write buffer sizes (bytes) to cost for pieces of `seq_chunk` tokens (0: whole
    sequences): the job's override, else the default, and its multiples for whole sequences
    whose level-3 saved set is larger than the default."""
    if spec.overrides.write_buffer_gib is not None:
        return [int(spec.overrides.write_buffer_gib * GIB)]
    if seq_chunk or mm.saved_bytes(dims, spec, 3) <= WRITE_BUFFER_BYTES:
        return [WRITE_BUFFER_BYTES]
    return [k * WRITE_BUFFER_BYTES for k in WRITE_BUFFER_MULTIPLES]


def window_homes(spec: JobSpec, device: str) -> list[bool]:
    """Where a job in pieces may keep its window (worker/ops/host_window.py): the job's
    override, else the device and, on a CUDA device, the host too (its memory for link
    traffic); packed documents keep theirs on the device."""
    if spec.overrides.window_home is not None:
        return [spec.overrides.window_home]
    return [False, True] if device == "cuda" and not spec.document_mask else [False]


def seq_chunks(spec: JobSpec, dims: ModelDims, pieces: bool = True) -> list[tuple[int, int]]:
    """(seq_chunk, pieces) options: whole sequences, and with `pieces` for a dense model
    the piece lengths that divide a longer sequence (or the override's)."""
    S, o = spec.seq_len, spec.overrides
    if o.seq_chunk is not None:
        c = o.seq_chunk if 0 < o.seq_chunk < S else 0
        return [(c, piece_count(S, c))]
    if dims.is_moe or not pieces:
        return [(0, 1)]
    return [(0, 1)] + [(c, piece_count(S, c)) for c in SEQ_CHUNKS if c < S and S % c == 0]
