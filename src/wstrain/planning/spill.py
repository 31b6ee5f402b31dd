"""The disk tier's planning: how many layers' AdamW moments go to the spill file, what they
take on disk and in host slots, and what reading and writing them adds to the host update.

Moments are the coldest state: each is read and written once a step, by the host AdamW, and
nothing else touches it. The planner spills the last layers first (the host updates layers
in order, so the last are needed last by the next forward) and only as many as the host
budget needs (working_set.make_ws_plan): every spilled byte is read and written once a step
at the disk's rate, 1.6 and 2.2 GB/s on the lent H200's virtio disk against ~7 GB/s of
moments the host AdamW updates, so a spilled layer's update is the disk's time, not the
CPU's.

    record = spill_record_bytes(dims, "bf16")          # one layer's (m, v), 4 KiB aligned
    counts = spill_counts(least, most)        # the spill counts a plan search tries
    ends = spilled_update_ends(ready_s, count, layer_s, read_s, write_s)  # each layer's
"""

from __future__ import annotations

from wstrain.contracts.calibration import (
    ALIGN_ELEMS,
    ELEMENT_BYTES,
    SPILL_ALIGN_BYTES,
    SPILL_SLOTS,
)
from wstrain.contracts.hardware import NodeProfile
from wstrain.contracts.model_dims import ModelDims

# the most spill counts the planner searches beside the least that fits: each is a whole
# layout search (10-75 ms of CPU a preset)
SPILL_CHOICES = 4

# (spilled layers, one layer's read seconds, its write seconds)
SpillIO = tuple[int, float, float]


def moment_element_bytes(precision: str) -> int:
    """Bytes of one AdamW moment element: fp32 in mixed precision, else the streamed size."""
    return 4 if precision == "mixed" else ELEMENT_BYTES[precision]


def spill_record_bytes(dims: ModelDims, precision: str) -> int:
    """One layer's (m, v) in the spill file and in a slot: each moment its tile (every
    tensor of the layer padded to ALIGN_ELEMS elements, worker/runtime/working_set/arena.py;
    counted here as a whole ALIGN_ELEMS more a tensor, an upper bound) at a 4 KiB boundary
    (direct I/O's alignment)."""
    # a dense layer's 7 matrices and 2 norms (+2 per-head q/k norms); an MoE layer's router,
    # 3 matrices an expert and a gated shared expert
    tensors = 11 + (1 + 3 * dims.num_experts + 4 if dims.is_moe else 0)
    padded = dims.layer_params + ALIGN_ELEMS * tensors
    moment = moment_element_bytes(precision) * padded
    return 2 * (-(-moment // SPILL_ALIGN_BYTES) * SPILL_ALIGN_BYTES)


def disk_bytes(dims: ModelDims, precision: str, spilled: int) -> int:
    """The spill file of `spilled` layers: what the disk budget must hold."""
    return spilled * spill_record_bytes(dims, precision)


def host_saved_bytes(dims: ModelDims, precision: str, spilled: int) -> int:
    """Host bytes `spilled` layers free: their moments, less the slots that stream them."""
    if not spilled:
        return 0
    moments = 2 * moment_element_bytes(precision) * dims.layer_params
    return spilled * moments - SPILL_SLOTS * spill_record_bytes(dims, precision)


def most_spilled(dims: ModelDims, precision: str, disk_budget_bytes: int) -> int:
    """The most layers whose moments the disk budget holds (all of them at most)."""
    return min(dims.num_layers, disk_budget_bytes // spill_record_bytes(dims, precision))


def least_spilled(dims: ModelDims, precision: str, over_bytes: int, most: int) -> int | None:
    """The fewest spilled layers that free `over_bytes` of host (None: `most` do not)."""
    for n in range(1, most + 1):
        if host_saved_bytes(dims, precision, n) >= over_bytes:
            return n
    return None


def spill_counts(least: int, most: int) -> list[int]:
    """The spill counts the planner tries: the least that fits, and up to SPILL_CHOICES - 1
    more spaced evenly up to the most the disk holds (more host for saved sets against more
    disk traffic; the cost model weighs them)."""
    if most <= least:
        return [least]
    step = max(1, -(-(most - least) // (SPILL_CHOICES - 1)))
    return sorted({*range(least, most, step), most})


def spill_io_seconds(dims: ModelDims, precision: str, node: NodeProfile) -> tuple[float, float]:
    """(read, write) seconds of one layer's moments at the node's disk rates: each direction
    at its own rate, both scaled so that a read and a write together take what the disk
    measured moving both ways in the spill's order (disk_both_bytes_per_s), where it was
    measured (a read overlaps the other slot's write: 8% faster on one lent H200's disk,
    2% slower on another)."""
    record = spill_record_bytes(dims, precision)
    read_s, write_s = record / node.disk_read_bytes_per_s, record / node.disk_write_bytes_per_s
    if node.disk_both_bytes_per_s > 0:
        scale = 2 * record / node.disk_both_bytes_per_s / (read_s + write_s)
        read_s, write_s = read_s * scale, write_s * scale
    return read_s, write_s


def spilled_update_ends(
    ready_s: float, count: int, layer_s: float, read_s: float, write_s: float
) -> list[float]:
    """When the host thread ends each of `count` spilled layers' updates, reaching the
    first at `ready_s` (its clock; the update started at 0). The disk serves requests in the
    order issued, one at a time: the first SPILL_SLOTS reads go out when the update starts,
    each layer's write when its update ends, and the next read into a slot as soon as that
    slot's write is done (working_set/spill.py)."""
    disk_s, updated, ends = 0.0, ready_s, []
    read_end: dict[int, float] = {}
    for j in range(min(SPILL_SLOTS, count)):
        disk_s += read_s
        read_end[j] = disk_s
    for j in range(count):
        updated = max(updated, read_end[j]) + layer_s
        ends.append(updated)
        disk_s = max(disk_s, updated) + write_s
        if j + SPILL_SLOTS < count:
            disk_s += read_s  # the freed slot's next read follows its write
            read_end[j + SPILL_SLOTS] = disk_s
    return ends
