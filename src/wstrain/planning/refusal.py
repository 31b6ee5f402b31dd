"""Why a working-set plan does not fit, in numbers a user can act on: the smallest device
and host budgets that would (InfeasibleBudget's min_budget), and what the disk tier, all
moments on disk or fp8 saved sets would do for a host too small. Long context counts what
it must: at a million tokens a layer's saved input is 8 GiB (past any device window) and a
window of keys and values kept on the host 12 GiB more of host.

    raise infeasible(spec, dims, node, device, micro_batches)
"""

from __future__ import annotations

import math

from wstrain.contracts.calibration import GIB
from wstrain.contracts.errors import InfeasibleBudget
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.plan import MinBudget
from wstrain.contracts.spec import JobSpec
from wstrain.planning import memory_model as mm
from wstrain.planning import spill as sp
from wstrain.planning.layouts import seq_chunks, window_homes, write_buffers


def host_over_bytes(spec: JobSpec, dims: ModelDims, device: str) -> int:
    """Host bytes past the budget with every saved set on the device: spilling's least."""
    return mm.host_bytes(dims, spec, 0, device) - spec.budget.host_bytes


def infeasible(
    spec: JobSpec, dims: ModelDims, node: NodeProfile, device: str, mbs: list[int]
) -> InfeasibleBudget:
    smallest = [  # long context: with its window on the host too, as layouts() weighs it
        mm.Layout(
            min(mbs), 2, 1, "host", 512, seq_chunk=c, pieces=p, window_home=h, write_buffer_bytes=b
        )
        for c, p in seq_chunks(spec, dims)
        for h in (window_homes(spec, device) if p > 1 else [False])
        for b in write_buffers(spec, dims, c)[:1]  # an override's, else the default
    ]

    def one(lay: mm.Layout, w: int) -> int:  # device bytes with the last w layers' sets kept
        kept = w * lay.units * mm.saved_bytes(dims, spec, 0, lay.seq_chunk, home=False)
        return mm.device_bytes(dims, spec, lay, w, kept)

    def device_bytes(w: int) -> int:
        return min(one(lay, w) for lay in smallest)

    # the host of a layout the device budget admits (a window on the host costs host bytes)
    fits = [lay for lay in smallest if one(lay, 0) <= spec.budget.device_bytes] or smallest
    least = min(fits, key=lambda lay: _host_inputs_home(spec, dims, device, lay))
    host_all_home = _host_inputs_home(spec, dims, device, least)
    need = MinBudget(
        device_gib=round(min(device_bytes(0), device_bytes(dims.num_layers)) / GIB + 0.005, 2),
        host_gib=round(host_all_home / GIB + 0.005, 2),
    )
    host_short = need.host_gib > spec.budget.host_gib
    # what spilling must free: with every saved set on the device where the budget holds
    # them, else with them home (long context: 8 GiB a layer at 1M tokens, past any device)
    over = (
        host_over_bytes(spec, dims, device)
        if device_bytes(dims.num_layers) <= spec.budget.device_bytes
        else host_all_home - spec.budget.host_bytes
    )
    advice, need.disk_gib, disk_short = _disk_advice(spec, dims, node, host_short, over)
    if host_short and not advice and may_spill(spec):
        advice = _all_spilled_advice(spec, dims, node, need.host_gib)
    if host_short:
        advice += _fp8_advice(spec, dims, device, least)
    overlap = (
        " with overrides.overlap=true (two rounds in flight: their transitions and copies on "
        "the device, their saved sets on the host); drop overlap, or raise the budget past"
        if spec.overrides.overlap
        else " even with the working-set runtime; raise the budget to at least"
    )
    return InfeasibleBudget(
        f"budget device_gib={spec.budget.device_gib}, host_gib={spec.budget.host_gib} cannot "
        f"hold {dims.params / 1e6:.1f}M parameters at seq_len={spec.seq_len}{overlap} "
        f"device_gib={need.device_gib}, host_gib={need.host_gib}{advice}",
        min_budget=need.model_dump(),
        **({"field": "budget.disk_gib"} if disk_short else {}),
    )


NO_DIR = " (the agent's WSTRAIN_SPILL_DIR; this node has none)"


def _host_inputs_home(spec: JobSpec, dims: ModelDims, device: str, lay: mm.Layout) -> int:
    """Host bytes of the job at `lay` with every layer's saved input home."""
    inputs_home = dims.num_layers * lay.micro_batch * mm.saved_bytes(dims, spec, 0)
    return mm.host_bytes(dims, spec, inputs_home, device, lay=lay)


def _fp8_advice(spec: JobSpec, dims: ModelDims, device: str, lay: mm.Layout) -> str:
    """For a host budget its saved inputs overrun (long context: 8 GiB a layer at 1M tokens)
    where fp8 saved sets would fit: the host budget they need."""
    if spec.activation_precision == "fp8" or spec.precision == "fp32" or device != "cuda":
        return ""
    fp8 = spec.model_copy(update={"activation_precision": "fp8"})
    host_gib = math.ceil(_host_inputs_home(fp8, dims, device, lay) / GIB * 100) / 100
    if host_gib > spec.budget.host_gib:
        return ""
    return f"; or activation_precision: fp8 (saved sets at 8 bits, lossy): host_gib={host_gib:g}"


def may_spill(spec: JobSpec) -> bool:
    """Whether the disk tier could take this job's moments on some node: one rank, the
    host updating the spilled layers (the device optimizer streams the moments instead)."""
    return spec.gpus * spec.nodes == 1 and spec.overrides.optimizer != "device"


def _all_spilled_advice(spec: JobSpec, dims: ModelDims, node: NodeProfile, host_gib: float) -> str:
    """For a host budget that spilling every layer's moments would not rescue: a host
    budget that does with them all on disk (`host_gib`, the advice without the tier, less
    what they free: the planner may fit a little less), and the disk that takes them."""
    L = dims.num_layers
    host = host_gib - sp.host_saved_bytes(dims, spec.precision, L) / GIB
    disk = sp.disk_bytes(dims, spec.precision, L) / GIB
    return (
        f"; the disk tier cannot make up the difference: with all {L} layers' AdamW moments "
        f"on disk (budget.disk_gib >= {math.ceil(disk * 100) / 100:g}), "
        f"host_gib={math.ceil(host * 100) / 100:g} holds it"
        + ("" if node.disk_read_bytes_per_s > 0 else f" on a node with a spill directory{NO_DIR}")
    )


def _disk_advice(
    spec: JobSpec, dims: ModelDims, node: NodeProfile, host_short: bool, over_bytes: int
) -> tuple[str, float, bool]:
    """(what the disk tier would do for a host budget too small (`host_short`) by
    `over_bytes`, as a clause; the disk GiB that would hold the overflow, 0 where it cannot
    help; whether the job's own disk budget is what falls short)."""
    over = max(1, over_bytes)
    least = sp.least_spilled(dims, spec.precision, over, dims.num_layers) if host_short else None
    if least is None:  # the host is not short, or spilling every moment would not do
        return "", 0.0, False
    need = sp.disk_bytes(dims, spec.precision, least)
    need_gib = math.ceil(need / GIB * 100) / 100
    if spec.gpus * spec.nodes > 1:
        return "; the disk tier (budget.disk_gib) runs one-GPU jobs only", 0.0, False
    if not may_spill(spec):
        return (
            "; the disk tier (budget.disk_gib) needs the host optimizer: drop "
            "overrides.optimizer=device",
            0.0,
            False,
        )
    if 0 < spec.budget.disk_bytes < need:
        return (
            f"; budget.disk_gib={spec.budget.disk_gib:g} is too small for the {least} layers' "
            f"AdamW moments the host cannot hold: give budget.disk_gib >= {need_gib:g}",
            need_gib,
            True,
        )
    if node.disk_read_bytes_per_s <= 0:
        return (
            f"; or budget.disk_gib >= {need_gib:g} on a node with a spill directory{NO_DIR}",
            need_gib,
            False,
        )
    if spec.budget.disk_bytes >= need:  # the disk is not what falls short: say so
        return (
            f"; budget.disk_gib={spec.budget.disk_gib:g} holds the {least} layers' AdamW "
            "moments the host cannot hold",
            need_gib,
            False,
        )
    return f"; or budget.disk_gib >= {need_gib:g} (the disk tier)", need_gib, False
