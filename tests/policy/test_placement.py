"""Packing by budgets (policy/placement.py through `decide`): best fit, the link
share, exclusive jobs, host memory, a CPU node's pseudo-device, and the resource reasons.

    pytest tests/policy/test_placement.py
"""

from __future__ import annotations

from wstrain.contracts.calibration import GIB
from wstrain.policy import (
    Decision,
    Gpu,
    NodeState,
    PendingJob,
    PolicyConfig,
    RunningJob,
    Start,
    WaitKind,
    decide,
)

H200 = 141 * GIB
NODE = NodeState(tuple(Gpu(i, H200) for i in range(3)), 1024 * GIB)


def _p(jid: str, dev_gib: float, host_gib: float = 8, exclusive: bool = False) -> PendingJob:
    return PendingJob(jid, "ana", 0, 0.0, int(dev_gib * GIB), int(host_gib * GIB), exclusive)


def _r(
    jid: str,
    gpu: int | None,
    dev_gib: float,
    host_gib: float = 8,
    exclusive: bool = False,
    stopping: bool = False,
) -> RunningJob:
    dev, host = int(dev_gib * GIB), int(host_gib * GIB)
    return RunningJob(jid, "ben", 0, gpu, dev, host, 0.0, exclusive, stopping)


def _decide(
    pending: list[PendingJob], running: list[RunningJob], node: NodeState = NODE
) -> Decision:
    """Plain packing: no drain hold."""
    return decide(100.0, pending, running, node, {}, PolicyConfig(drain=False))


def test_best_fit_takes_the_gpu_left_with_least_free_memory() -> None:
    # free: GPU 0 41 GiB, GPU 1 111 GiB, GPU 2 141 GiB
    running = [_r("r0", 0, 100), _r("r1", 1, 30)]
    d = _decide([_p("a", 40)], running)
    assert d.start == (Start("a", 0, 2),)  # 1 GiB left on GPU 0; it shares the link with r0
    d = _decide([_p("b", 50)], running)
    assert d.start == (Start("b", 1, 2),)
    d = _decide([_p("c", 120)], running)
    assert d.start == (Start("c", 2, 1),)


def test_several_jobs_start_in_one_round_and_the_link_share_counts_them() -> None:
    d = _decide([_p("a", 40), _p("b", 40), _p("c", 40), _p("d", 100)], [])
    gpus = {s.job_id: s.gpu_index for s in d.start}
    shares = {s.job_id: s.link_share for s in d.start}
    assert gpus == {"a": 0, "b": 0, "c": 0, "d": 1}
    assert shares == {"a": 1, "b": 2, "c": 3, "d": 1}


def test_jobs_being_stopped_hold_memory_but_not_a_link_share() -> None:
    d = _decide([_p("a", 100)], [_r("s", 0, 41, stopping=True), _r("r", 1, 50)])
    assert d.start == (Start("a", 0, 1),)


def test_an_exclusive_job_needs_an_empty_gpu() -> None:
    running = [_r("r0", 0, 12), _r("r1", 1, 12)]
    d = _decide([_p("x", 12, exclusive=True)], running)
    assert d.start == (Start("x", 2, 1),)
    d = _decide([_p("x", 12, exclusive=True)], [*running, _r("r2", 2, 12)])
    assert d.start == ()
    assert d.reasons["x"] == (
        "resources: no GPU is empty for an exclusive job (the emptiest holds 1 job)"
    )
    assert d.kinds["x"] == WaitKind.resources


def test_nothing_is_packed_beside_an_exclusive_job() -> None:
    node = NodeState((Gpu(0, H200),), 1024 * GIB)
    d = _decide([_p("a", 12)], [_r("x", 0, 12, exclusive=True)], node)
    assert d.start == ()
    assert d.reasons["a"] == "resources: no GPU has 12.0 GiB free (largest free 0.0 GiB)"


def test_no_gpu_has_room_reason_names_the_largest_hole() -> None:
    running = [_r("r0", 0, 129), _r("r1", 1, 131), _r("r2", 2, 135)]
    d = _decide([_p("a", 20)], running)
    assert d.reasons["a"] == "resources: no GPU has 20.0 GiB free (largest free 12.0 GiB)"


def test_host_memory_is_checked_on_the_node() -> None:
    node = NodeState((Gpu(0, H200), Gpu(1, H200)), 100 * GIB)
    d = _decide([_p("a", 12, host_gib=64)], [_r("r", 0, 12, host_gib=70)], node)
    assert d.start == ()
    assert d.reasons["a"] == (
        "resources: needs 64.0 GiB of host memory, 30.0 GiB unreserved on the node"
    )


def test_a_job_larger_than_any_gpu_says_so() -> None:
    d = _decide([_p("a", 200)], [])
    assert d.reasons["a"] == (
        "resources: needs 200.0 GiB of device memory, the largest GPU has 141.0 GiB"
    )


def test_a_cpu_node_packs_device_and_host_budgets_into_host_memory() -> None:
    cpu = NodeState((), 64 * GIB)
    d = _decide([_p("a", 16, 16), _p("b", 16, 8), _p("c", 8, 8)], [], cpu)
    # a and b take 56 of 64 GiB; c's 16 do not fit in the 8 left
    assert d.start == (Start("a", None, 1), Start("b", None, 1))
    assert d.reasons["c"] == (
        "resources: needs 16.0 GiB (device + host budgets), 8.0 GiB unreserved on the node"
    )


def _spilling(jid: str, disk_gib: float, dev_gib: float = 12) -> PendingJob:
    return PendingJob(
        jid, "ana", 0, 0.0, int(dev_gib * GIB), 8 * GIB, disk_bytes=int(disk_gib * GIB)
    )


def test_spill_space_is_packed_like_host_memory() -> None:
    node = NodeState((Gpu(0, H200), Gpu(1, H200)), 1024 * GIB, disk_bytes=200 * GIB)
    running = [
        RunningJob("r", "ben", 0, 0, 12 * GIB, 8 * GIB, 0.0, disk_bytes=150 * GIB),
    ]
    d = _decide([_spilling("a", 100), _spilling("b", 40), _p("c", 12)], running, node)
    # "a" would pass the node's spill space; "b" fits beside "r"; "c" spills nothing
    assert [s.job_id for s in d.start] == ["b", "c"]
    assert d.reasons["a"] == (
        "resources: needs 100.0 GiB of spill space, 50.0 GiB unreserved on the node"
    )
    assert d.preempt == ()  # nothing is stopped for spill space


def test_a_node_without_a_spill_directory_starts_no_spilling_job() -> None:
    d = _decide([_spilling("a", 10)], [])
    assert d.start == ()
    assert "no spill directory (WSTRAIN_SPILL_DIR)" in d.reasons["a"]
