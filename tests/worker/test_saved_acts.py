"""worker/saved_acts.py's backward prefetch on CPU (streams are no-ops, the bookkeeping is
the one CUDA runs): sets start in queue order up to the byte cap, a set taken frees its
bytes for the next, a set taken before its turn is never copied again, and what backward
takes is the host copy's contents.

    pytest tests/worker/test_saved_acts.py
"""

from __future__ import annotations

import pytest
import torch

from worker.rings import Streams
from worker.saved_acts import BackwardPrefetch, HostCopy, SavedTensorPolicy


def _copies(n: int, numel: int) -> list[HostCopy]:
    return [HostCopy(torch.full((numel,), float(i)), done=None) for i in range(n)]


def test_prefetch_keeps_the_cap_and_follows_what_backward_takes() -> None:
    streams, counters = Streams(torch.device("cpu")), {"h2d_bytes": 0, "d2h_bytes": 0}
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
    for c in copies[1:4]:
        assert torch.equal(policy.fetch(c), c.host)
    ahead.top_up()
    assert not ahead.queue and not ahead.started


def test_host_copy_keeps_a_transposed_layout() -> None:
    """SDPA's q/k/v and output are transposed views: their host room has the same strides,
    so the copy home is one plain copy and the copy back has the kernel's layout."""
    from worker.arena import HostArena
    from worker.saved_acts import HostActivationStore

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
    from worker.arena import HostArena
    from worker.saved_acts import HostActivationStore

    streams = Streams(torch.device("cuda"))
    policy = SavedTensorPolicy(streams, HostActivationStore(HostArena(pin=True)),
                               lambda: torch.empty(0, device="cuda"), [],
                               {"h2d_bytes": 0, "d2h_bytes": 0})
    packed: dict[tuple[object, ...], HostCopy] = {}
    x = torch.randn(64, 64, device="cuda", requires_grad=True)
    with policy.hooks(True, packed):
        y = (x * x).sum()
    assert len(packed) == 1 and next(iter(packed.values())).host.device.type == "cpu"
    y.backward()
    assert torch.allclose(x.grad, 2 * x)
