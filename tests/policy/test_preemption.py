"""Preemption (policy/preemption.py through `decide`): a higher-class job that
cannot be placed stops the fewest, lowest-class, most recently started jobs on one GPU, only
when that really makes it fit, holds the GPU while they stop, and never picks them twice.

    pytest tests/policy/test_preemption.py
"""

from __future__ import annotations

from dataclasses import replace

from wstrain.contracts.calibration import GIB
from wstrain.policy import (
    Gpu,
    NodeState,
    PendingJob,
    PolicyConfig,
    Quota,
    RunningJob,
    Start,
    WaitKind,
    decide,
)

NODE = NodeState((Gpu(0, 141 * GIB), Gpu(1, 141 * GIB)), 1024 * GIB)


def _p(
    jid: str, priority: int, dev_gib: float, host_gib: float = 8, exclusive: bool = False
) -> PendingJob:
    dev, host = int(dev_gib * GIB), int(host_gib * GIB)
    return PendingJob(jid, "ana", priority, 0.0, dev, host, exclusive)


def _r(
    jid: str, gpu: int, priority: int, dev_gib: float, started_s: float, host_gib: float = 8
) -> RunningJob:
    dev, host = int(dev_gib * GIB), int(host_gib * GIB)
    return RunningJob(jid, "ben", priority, gpu, dev, host, started_s)


def test_the_fewest_victims_of_the_lowest_class() -> None:
    running = [
        _r("A", 0, -5, 40, 10.0),  # GPU 0: 80 GiB used, 61 free
        _r("B", 0, -10, 20, 20.0),
        _r("C", 0, -10, 20, 30.0),
        _r("D", 1, -10, 120, 5.0),  # GPU 1: 21 free
    ]
    d = decide(100.0, [_p("H", 10, 100)], running, NODE, {})
    # GPU 0 needs A alone (class -5) or B and C; GPU 1 needs D alone (class -10): one
    # victim either way, and D is of the lower class
    assert d.preempt == ("D",)
    assert d.held == {"H": 1}
    assert d.kinds["H"] == WaitKind.preemption
    assert d.reasons["H"] == "preemption: stopping 1 job of class -10 on GPU 1"
    assert d.start == ()


def test_among_equals_the_most_recently_started_goes() -> None:
    running = [_r("P", 0, 5, 60, 0.0), _r("B", 0, -10, 40, 20.0), _r("C", 0, -10, 40, 30.0)]
    node = NodeState((Gpu(0, 141 * GIB),), 1024 * GIB)
    d = decide(100.0, [_p("H", 10, 40)], running, node, {})
    assert d.preempt == ("C",)


def test_two_victims_when_no_single_one_makes_room() -> None:
    running = [_r("B", 0, -10, 40, 20.0), _r("C", 0, -10, 40, 30.0), _r("E", 0, -10, 60, 1.0)]
    node = NodeState((Gpu(0, 141 * GIB),), 1024 * GIB)
    d = decide(100.0, [_p("H", 10, 100)], running, node, {})
    # 99 GiB missing: only E (60) with a 40 GiB job frees them; C started after B
    assert sorted(d.preempt) == ["C", "E"]


def test_no_preemption_of_the_same_or_a_higher_class() -> None:
    running = [_r("A", 0, 0, 130, 0.0), _r("B", 1, 10, 130, 0.0)]
    d = decide(100.0, [_p("H", 0, 100)], running, NODE, {})
    assert d.preempt == ()
    assert d.kinds["H"] == WaitKind.resources


def test_no_preemption_when_the_host_memory_would_still_be_short() -> None:
    node = NodeState((Gpu(0, 141 * GIB), Gpu(1, 141 * GIB)), 512 * GIB)
    running = [_r("L", 0, -10, 80, 0.0, host_gib=16), _r("K", 1, 10, 80, 0.0, host_gib=400)]
    # host free 96 GiB; evicting L frees 16: 112 GiB covers 100, not 120
    d = decide(100.0, [_p("H", 10, 100, host_gib=100)], running, node, {})
    assert d.preempt == ("L",)
    d = decide(100.0, [_p("H", 10, 100, host_gib=120)], running, node, {})
    assert d.preempt == ()
    assert d.reasons["H"].startswith("resources: no GPU has 100.0 GiB free")


def test_an_exclusive_job_evicts_only_a_gpu_of_lower_classes() -> None:
    running = [
        _r("L", 0, -10, 12, 0.0),
        _r("K", 0, 10, 12, 0.0),  # GPU 0 keeps K: class 10 is not below 5
        _r("M", 1, -10, 100, 0.0),
    ]
    d = decide(100.0, [_p("H", 5, 12, exclusive=True)], running, NODE, {})
    assert d.preempt == ("M",)
    assert d.held == {"H": 1}


def test_the_held_gpu_stays_free_for_the_preempting_job() -> None:
    running = [_r("A", 0, 0, 80, 0.0), _r("D", 1, -10, 120, 5.0)]
    pending = [_p("H", 10, 100), _p("S", 0, 15)]
    d = decide(100.0, pending, running, NODE, {})
    # S fits best on GPU 1 (21 free), but GPU 1 is held for H: it goes to GPU 0
    assert d.preempt == ("D",)
    assert d.start == (Start("S", 0, 2),)
    # while D stops nobody else is preempted and H keeps the GPU
    stopping = [running[0], replace(running[1], stopping=True)]
    d = decide(110.0, [_p("H", 10, 100), _p("T", 0, 15)], stopping, NODE, {})
    assert d.preempt == ()
    assert d.reasons["H"] == "resources: waiting for 1 stopping job to leave GPU 1"
    assert d.held == {"H": 1}
    assert d.start == (Start("T", 0, 2),)
    # once it has gone, H starts there
    d = decide(130.0, [_p("H", 10, 100)], running[:1], NODE, {})
    assert d.start == (Start("H", 1, 1),)


def test_a_job_behind_a_held_gpu_says_why() -> None:
    running = [_r("A", 0, 0, 141, 0.0), _r("D", 1, -10, 120, 5.0)]
    d = decide(100.0, [_p("H", 10, 100), _p("S", 0, 15)], running, NODE, {})
    assert d.kinds["S"] == WaitKind.priority
    assert d.reasons["S"] == "priority: 1 job ahead; GPU 1 is held for H"


def test_the_preempting_job_keeps_its_quota_from_its_owners_smaller_jobs() -> None:
    config = PolicyConfig(quotas={"ana": Quota(max_jobs=1)})
    running = [_r("K", 0, 10, 100, 0.0), _r("D", 1, -10, 141, 5.0)]
    d = decide(100.0, [_p("H", 10, 141), _p("S", 0, 12)], running, NODE, {}, config)
    # S would fit beside K, but H's quota is set aside while D stops
    assert d.preempt == ("D",)
    assert d.reasons["S"] == "quota: 1 of 1 jobs running"
