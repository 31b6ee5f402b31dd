"""The working-set runtime's side of data parallelism: what a rank trains on, and how its
gradients reach the node's one host copy (working_set/node_share.py).

Each rank trains its run of the step's global batch (runtime/distributed.py RankSlice).
In each round, rank r's gradient slot for layer k starts as zeros except its own span, which
holds what its host tile has gathered so far (the sum over every rank of the earlier rounds;
only rank r writes that span); the round's backward adds this rank's gradients; one
all-reduce then makes the span the sum over every rank and round so far, and only the span
goes home. The other spans of the slot are other ranks' business and are dropped. Per layer
and round that is one all-reduce of the layer (NVLink on a GPU node) and 1/N of its gradient
over each rank's PCIe link, in and out. The loss and the clipping norm are summed over
ranks, so every rank clips by the same factor and the spans' updates are the one-GPU update.

Several nodes each keep their own copy, which their ranks split by local rank; the sums
run over every rank of every node, so only node 0's ranks bring their span of the earlier
rounds into a round's slot (every node's copy holds the same sums: brought by all, they
would count once a node), and the clipping norm, summed over the spans of every node, is
divided by the node count. One rank (no group) runs the same code: whole spans,
no collectives.

    shards = RankShards(group, host)
    data = shards.batches(data, cfg.rounds)
    own = shards.reduce(slot.flat, k)        # (span,) this rank's summed gradient
"""

from __future__ import annotations

import torch

from wstrain.worker.runtime.base import Batches
from wstrain.worker.runtime.distributed import ProcessGroup, RankSlice
from wstrain.worker.runtime.working_set.state import HostState


class RankShards:
    def __init__(self, group: ProcessGroup | None, host: HostState) -> None:
        self.group = group
        self.rank, self.world = (group.rank, group.world) if group is not None else (0, 1)
        self.local_rank = group.local_rank if group is not None else 0
        self.spans = host.spans  # per group: this rank's [lo, hi) of its node's copy
        share = host.arena.share
        self.local_world = share.world if share is not None else 1
        assert self.world % self.local_world == 0, "every node runs as many ranks"
        self.nodes = self.world // self.local_world  # copies of the host state

    @property
    def layer_span(self) -> tuple[int, int] | None:
        """This rank's span of a decoder layer's tile (every layer's is alike), which it
        sends home; None where the whole tile is its own (one rank on its node)."""
        return self.spans[0] if self.local_world > 1 else None

    @property
    def layer_load_span(self) -> tuple[int, int] | None:
        """What of its tile's earlier rounds this rank brings into a round's slot: its span
        on node 0, nothing on the other nodes of a multi-node job."""
        if self.nodes > 1 and self.rank >= self.local_world:
            return (0, 0)
        return self.layer_span

    def batches(self, data: Batches, rounds: int) -> Batches:
        """This rank's run of each step's global batch."""
        if self.group is None:
            return data
        return RankSlice(data, self.rank, self.world, rounds)

    def reduce(self, flat: torch.Tensor, group: int) -> torch.Tensor:
        """`flat`, the device gradient of host group `group`, summed over ranks in place;
        returns this rank's span of it (the part that goes home)."""
        if self.group is not None:
            self.group.sum_(flat)
        return self.own(flat, group)

    def own(self, flat: torch.Tensor, group: int) -> torch.Tensor:
        lo, hi = self.spans[group]
        return flat[lo:hi]

    def total(self, value: torch.Tensor) -> torch.Tensor:
        """A 0-d tensor summed over ranks (the loss)."""
        return self.group.sum_scalar(value) if self.group is not None else value

    def sq_norm(self, own_sq: torch.Tensor) -> torch.Tensor:
        """The squared gradient norm from each rank's over its spans: each node's spans
        cover the gradient once."""
        return self.total(own_sq) / self.nodes if self.nodes > 1 else self.total(own_sq)

    def barrier(self) -> None:
        if self.group is not None:
            self.group.barrier()
