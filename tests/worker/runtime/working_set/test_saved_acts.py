"""working_set/saved_acts.py's backward prefetch on CPU (streams are no-ops, the bookkeeping is
the one CUDA runs): sets start in queue order up to the byte cap, a set taken frees its
bytes for the next, a set taken before its turn is never copied again, and what backward
takes is the host copy's contents.

    pytest tests/working_set/test_saved_acts.py
"""

from __future__ import annotations

import pytest
import torch

from wstrain.contracts.calibration import WRITE_BUFFER_BYTES
from wstrain.worker.runtime.working_set.host_store import HostRoom
from wstrain.worker.runtime.working_set.rings import Streams
from wstrain.worker.runtime.working_set.saved_acts import (
    BackwardPrefetch,
    HostCopy,
    SavedTensorPolicy,
)


def _copies(n: int, numel: int) -> list[HostCopy]:
    return [HostCopy(HostRoom.whole(torch.full((numel,), float(i))), done=None) for i in range(n)]


def test_prefetch_keeps_the_cap_and_follows_what_backward_takes() -> None:
    streams = Streams(torch.device("cpu"))
    counters = {"h2d_bytes": 0, "d2h_bytes": 0, "h2d_on_demand_bytes": 0}
    policy = SavedTensorPolicy(streams, None, lambda: torch.empty(0), [], counters)  # type: ignore[arg-type]
    copies = _copies(5, 256)  # 1 KiB each
    ahead = BackwardPrefetch(streams, counters, cap_bytes=3 * 1024)
    for c in copies:
        ahead.add(c)
    ahead.add(torch.zeros(4))  # a set kept on the device: nothing to bring back

    ahead.top_up()
    assert [c.device is not None for c in copies] == [True, True, True, False, False]
    assert counters["h2d_bytes"] == 3 * 1024

    got = policy.fetch(copies[0])  # backward takes the first: its bytes free up
    assert torch.equal(got, copies[0].host.cpu()) and copies[0].used
    assert policy.fetch(copies[0]) is got  # taken again (by the kernel's backward): the same
    late = policy.fetch(copies[4])  # taken before its turn: copied in on the spot
    assert torch.equal(late, copies[4].host.cpu())
    ahead.top_up()
    assert copies[3].device is not None and policy.fetch(copies[4]) is late
    assert counters["h2d_bytes"] == 5 * 1024  # 4 prefetched, 1 copied in on the spot
    assert counters["h2d_on_demand_bytes"] == 1024
    for c in copies[1:4]:
        assert torch.equal(policy.fetch(c), c.host.cpu())
    ahead.top_up()
    assert not ahead.queue and not ahead.started


def test_a_set_taken_early_or_for_a_rebuild_leaves_the_prefetch() -> None:
    """Long context queues each piece's input twice, for the window's rebuild and for its
    backward. A rebuild's take lets the input go, so its bytes stop counting against the
    cap; the last input, in flight for the rebuild when its backward entry comes up, is
    claimed by its backward and stays on the device (no second copy, none on demand); a set
    taken before its turn (on demand) leaves the queue at the next top-up, so the queue
    never keeps a taken set's device copy alive. (Before, the first and the last stopped the
    prefetch for the rest of the layer, and every set fetched on demand meanwhile stayed on
    the device: a layer's sets at 512K, 37 GiB past a 24 GiB budget.)"""
    streams = Streams(torch.device("cpu"))
    counters = {"h2d_bytes": 0, "d2h_bytes": 0, "h2d_on_demand_bytes": 0}
    policy = SavedTensorPolicy(streams, None, lambda: torch.empty(0), [], counters)  # type: ignore[arg-type]
    inputs, others = _copies(4, 256), _copies(4, 256)  # 1 KiB each
    ahead = BackwardPrefetch(streams, counters, cap_bytes=1024)  # one set ahead
    for x in inputs:
        ahead.add(x, rebuild=True)
    for x, other in zip(reversed(inputs), reversed(others)):  # backward: last piece first
        ahead.add(x)
        ahead.add(other)

    for i, x in enumerate(inputs):  # the rebuild takes each input in order, topping up first
        ahead.top_up()
        assert torch.equal(policy.fetch_transient(x), x.host.cpu())
        assert (x.device is None) == (i < 3)  # the last stays for its backward
    ahead.top_up()  # what the rebuild let go is not ahead; the input it kept is
    assert inputs[3].device is not None and others[3].device is None
    assert all(c.device is None for c in (*inputs[:3], *others))

    def take(c: HostCopy, top_up: bool = True) -> None:
        assert torch.equal(policy.fetch(c), c.host.cpu())
        if top_up:
            ahead.top_up()
        assert all(not q.used for q, _ in ahead.queue)  # nothing taken stays queued
        assert sum(q.host.nbytes for q in ahead.started) <= ahead.cap_bytes

    take(inputs[3])  # the rebuild's copy, no second one
    assert counters["h2d_on_demand_bytes"] == 0
    take(others[3])
    take(inputs[2], top_up=False)  # the link falls behind: no top-up before the next take
    take(others[2])  # taken before its prefetch started: copied on the spot, then dequeued
    assert counters["h2d_on_demand_bytes"] == 1024
    for c in (inputs[1], others[1], inputs[0], others[0]):
        take(c)
    assert not ahead.queue and not ahead.started
    assert counters["h2d_bytes"] == 11 * 1024  # inputs twice but the kept one, others once


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hooks_send_cuda_activations_home() -> None:
    """A runtime on "cuda" packs tensors on "cuda:0": they go home, scalars stay."""
    from wstrain.worker.runtime.working_set.arena import HostArena
    from wstrain.worker.runtime.working_set.host_store import HostActivationStore

    streams = Streams(torch.device("cuda"))
    policy = SavedTensorPolicy(
        streams,
        HostActivationStore(HostArena(pin=True)),
        lambda: torch.empty(0, device="cuda"),
        [],
        {"h2d_bytes": 0, "d2h_bytes": 0, "h2d_on_demand_bytes": 0},
    )
    packed: dict[tuple[object, ...], HostCopy] = {}
    x = torch.randn(64, 64, device="cuda", requires_grad=True)
    with policy.hooks(True, packed):
        y = (x * x).sum()
    assert len(packed) == 1 and next(iter(packed.values())).host.parts[0].device.type == "cpu"
    y.backward()
    assert torch.allclose(x.grad, 2 * x)


def test_sets_still_going_home_past_the_default_buffer_hold_the_prefetch_back() -> None:
    """At the turn from forward to backward the forward's last sets may still be on their
    way home; what of them is past the default buffer comes off the prefetch's cap, so with
    a planned larger buffer the two directions hold at most that buffer plus the default's
    1 GiB, as at the default (the model charges the buffer alone: up to 1 GiB uncharged
    at the turn, at any buffer)."""
    streams = Streams(torch.device("cpu"))
    counters = {"h2d_bytes": 0, "d2h_bytes": 0, "h2d_on_demand_bytes": 0}
    outgoing = [WRITE_BUFFER_BYTES + 2 * 1024]  # the default's worth and 2 KiB more
    copies = _copies(4, 256)  # 1 KiB each
    ahead = BackwardPrefetch(streams, counters, cap_bytes=3 * 1024, outgoing=lambda: outgoing[0])
    for c in copies:
        ahead.add(c)
    ahead.top_up()
    assert [c.device is not None for c in copies] == [True, False, False, False]
    outgoing[0] = WRITE_BUFFER_BYTES  # within the default: the whole cap again
    ahead.top_up()
    assert [c.device is not None for c in copies] == [True, True, True, False]
