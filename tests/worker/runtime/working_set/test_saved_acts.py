"""working_set/saved_acts.py's backward prefetch on CPU (streams are no-ops, the bookkeeping is
the one CUDA runs): sets start in queue order up to the byte cap, a set taken frees its
bytes for the next, a set taken before its turn is never copied again, and what backward
takes is the host copy's contents.

    pytest tests/working_set/test_saved_acts.py
"""

from __future__ import annotations

import itertools

import pytest
import torch

from wstrain.worker.runtime.working_set.rings import Streams
from wstrain.worker.runtime.working_set.saved_acts import (
    BackwardPrefetch,
    HostCopy,
    SavedTensorPolicy,
)


def _copies(n: int, numel: int) -> list[HostCopy]:
    return [HostCopy(torch.full((numel,), float(i)), done=None) for i in range(n)]


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
    assert torch.equal(got, copies[0].host) and copies[0].used
    assert policy.fetch(copies[0]) is got  # taken again (by the kernel's backward): the same
    late = policy.fetch(copies[4])  # taken before its turn: copied in on the spot
    assert torch.equal(late, copies[4].host)
    ahead.top_up()
    assert copies[3].device is not None and policy.fetch(copies[4]) is late
    assert counters["h2d_bytes"] == 5 * 1024  # 4 prefetched, 1 copied in on the spot
    assert counters["h2d_on_demand_bytes"] == 1024
    for c in copies[1:4]:
        assert torch.equal(policy.fetch(c), c.host)
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
        assert torch.equal(policy.fetch_transient(x), x.host)
        assert (x.device is None) == (i < 3)  # the last stays for its backward
    ahead.top_up()  # what the rebuild let go is not ahead; the input it kept is
    assert inputs[3].device is not None and others[3].device is None
    assert all(c.device is None for c in (*inputs[:3], *others))

    def take(c: HostCopy, top_up: bool = True) -> None:
        assert torch.equal(policy.fetch(c), c.host)
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


def test_host_copy_keeps_a_transposed_layout() -> None:
    """SDPA's q/k/v and output are transposed views: their host room has the same strides,
    so the copy home is one plain copy and the copy back has the kernel's layout."""
    from wstrain.worker.runtime.working_set.arena import HostArena
    from wstrain.worker.runtime.working_set.saved_acts import HostActivationStore

    store = HostActivationStore(HostArena(pin=False))
    t = torch.randn(2, 5, 4, 3).transpose(1, 2)  # (B, H, S, hd) view of (B, S, H, hd)
    host = store.take(t)
    assert host.shape == t.shape and host.stride() == t.stride()
    assert store.take(torch.randn(4, 6)).is_contiguous()
    odd = torch.randn(6, 8)[:, ::2]  # not dense: contiguous room
    assert store.take(odd).is_contiguous()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hooks_send_cuda_activations_home() -> None:
    """A runtime on "cuda" packs tensors on "cuda:0": they go home, scalars stay."""
    from wstrain.worker.runtime.working_set.arena import HostArena
    from wstrain.worker.runtime.working_set.saved_acts import HostActivationStore

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
    assert len(packed) == 1 and next(iter(packed.values())).host.device.type == "cpu"
    y.backward()
    assert torch.allclose(x.grad, 2 * x)


# A saved set's tensors in the order the runtime takes them, in KiB: the shapes of one
# Llama-3-8B (layer, 8K sequence) at 1/1024 scale: input, k, q, v, log-sum-exp, output
# (level 1), then gate and up (level 3).
LEVEL1_KIB = (64, 16, 64, 16, 1, 64)
LEVEL3_KIB = (*LEVEL1_KIB, 224, 224)


def test_store_packs_a_rounds_sets_and_reuses_them() -> None:
    """The host activation store holds a round's sets in their own bytes plus at most a
    chunk (a bump cursor over 64-unit chunks took 35% more on the H200 plans),
    and the next round's identical sets fit the same chunks."""
    from wstrain.worker.runtime.working_set.arena import HostArena
    from wstrain.worker.runtime.working_set.saved_acts import HostActivationStore

    kib = 1024
    store = HostActivationStore(HostArena(pin=False), chunk_bytes=64 * kib)
    sets = [LEVEL3_KIB if i % 9 == 4 else LEVEL1_KIB for i in range(60)]
    for _ in range(2):  # two rounds
        store.reset()
        taken = []
        for sizes in sets:
            for n in sizes:
                host = store.take(torch.empty(n * kib, dtype=torch.uint8))
                taken.append((host.data_ptr(), host.nbytes))
        wanted = sum(map(sum, sets)) * kib
        assert wanted <= store.arena.total_bytes <= wanted + 64 * kib
    taken.sort()  # no two tensors of a round overlap
    assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(taken))
