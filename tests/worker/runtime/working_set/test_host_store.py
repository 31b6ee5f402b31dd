"""working_set/host_store.py on CPU: a pass's sets fit their own bytes plus at most a chunk,
no two live sets share a byte, and with the cross-round overlap's order (the next pass's
layer i placed, then the previous pass's layer L-1-i released) one store holds about one
pass's sets, not two.

    pytest tests/worker/runtime/working_set/test_host_store.py
"""

from __future__ import annotations

import itertools

import torch

from wstrain.worker.runtime.working_set.arena import HostArena
from wstrain.worker.runtime.working_set.host_store import HostActivationStore

# A saved set's tensors in the order the runtime takes them, in KiB: the shapes of one
# Llama-3-8B (layer, 8K sequence) at 1/1024 scale: input, k, q, v, log-sum-exp, output
# (level 1), then gate and up (level 3).
LEVEL1_KIB = (64, 16, 64, 16, 1, 64)
LEVEL3_KIB = (*LEVEL1_KIB, 224, 224)
KIB = 1024


def _store() -> HostActivationStore:
    return HostActivationStore(HostArena(pin=False), chunk_bytes=64 * KIB)


def _place(store: HostActivationStore, tag: tuple[int, int], sizes: tuple[int, ...]) -> list:
    store.tag = tag
    out = []
    for n in sizes:
        host = store.take(torch.empty(n * KIB, dtype=torch.uint8))
        out.append((host.data_ptr(), host.nbytes))
    return out


def _disjoint(spans: list[tuple[int, int]]) -> bool:
    spans = sorted(spans)
    return all(a + n <= b for (a, n), (b, _) in itertools.pairwise(spans))


def test_host_copy_keeps_a_transposed_layout() -> None:
    """SDPA's q/k/v and output are transposed views: their host room has the same strides,
    so the copy home is one plain copy and the copy back has the kernel's layout."""
    store = HostActivationStore(HostArena(pin=False))
    t = torch.randn(2, 5, 4, 3).transpose(1, 2)  # (B, H, S, hd) view of (B, S, H, hd)
    host = store.take(t)
    assert host.shape == t.shape and host.stride() == t.stride()
    assert store.take(torch.randn(4, 6)).is_contiguous()
    odd = torch.randn(6, 8)[:, ::2]  # not dense: contiguous room
    assert store.take(odd).is_contiguous()


def test_store_packs_a_rounds_sets_and_reuses_them() -> None:
    """The store holds a round's sets in their own bytes plus at most a chunk (a bump
    cursor over 64-unit chunks took 35% more on the H200 plans), and the next round's
    identical sets, placed after the first's are released, fit the same chunks."""
    store = _store()
    sets = [LEVEL3_KIB if i % 9 == 4 else LEVEL1_KIB for i in range(60)]
    wanted = sum(map(sum, sets)) * KIB
    for r in range(2):  # two rounds, one after the other
        taken = [s for k, sizes in enumerate(sets) for s in _place(store, (r, k), sizes)]
        assert _disjoint(taken)
        assert wanted <= store.arena.total_bytes <= wanted + 64 * KIB
        assert store.live_bytes == sum(n for _, n in taken)
        for k in reversed(range(len(sets))):  # backward takes them back
            store.release((r, k), [])
        assert store.live_bytes == 0


def test_overlapped_passes_share_one_passs_room() -> None:
    """Pass p's forward beside pass q's backward (working_set/pass_order.py): p's layer i
    placed, then q's layer L-1-i released. Live sets never overlap, and the arena holds
    one pass's sets and a layer's more, plus a chunk, where a store per pass held two.
    The first pass carries two rounds (a lead pass) and the next ones a round each."""
    L = 16
    layer = tuple(n for _ in range(4) for n in LEVEL3_KIB)  # 4 units a round
    store = _store()
    live: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for k in range(L):  # pass 0, two rounds
        live[(0, k)] = _place(store, (0, k), layer + layer)
    first = store.arena.total_bytes
    for p in range(1, 6):
        for i in range(L):
            live[(p, i)] = _place(store, (p, i), layer)
            assert _disjoint([s for spans in live.values() for s in spans])
            store.release((p - 1, L - 1 - i), [])
            del live[(p - 1, L - 1 - i)]
    per_layer = sum(layer) * KIB
    # one pass's sets (the lead pass's), and the next pass's first layer beside them
    assert store.arena.total_bytes <= first + per_layer + 64 * KIB
    for i in range(L):
        store.release((5, L - 1 - i), [])
    assert store.live_bytes == 0
    grown = store.arena.total_bytes
    store.reset()  # the next step finds every chunk free: no new tile
    for k in range(L):
        _place(store, (0, k), layer + layer)
    assert store.arena.total_bytes == grown
