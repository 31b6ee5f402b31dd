"""Jobs on several GPUs of one node (policy/gangs.py through `decide`): all of
their GPUs at once or none, their device budget held on each GPU and their host budget once,
the reasons they wait with, the drain hold, quotas and fair share.

    pytest tests/policy/test_gangs.py
"""

from __future__ import annotations

from wstrain.contracts.calibration import GIB
from wstrain.policy import (
    Decision,
    Gpu,
    NodeState,
    PendingJob,
    PolicyConfig,
    Quota,
    RunningJob,
    Start,
    WaitKind,
    decide,
    running_weight,
)

H100 = 80 * GIB
NODE = NodeState(tuple(Gpu(i, H100) for i in range(3)), 512 * GIB)


def _p(
    jid: str, dev_gib: float, gpus: int = 1, host_gib: float = 8, exclusive: bool = False
) -> PendingJob:
    dev, host = int(dev_gib * GIB), int(host_gib * GIB)
    return PendingJob(jid, "ana", 0, 0.0, dev, host, exclusive, gpus=gpus)


def _r(
    jid: str, gpus: tuple[int, ...], dev_gib: float, host_gib: float = 8, stopping: bool = False
) -> RunningJob:
    dev, host = int(dev_gib * GIB), int(host_gib * GIB)
    gang = gpus if len(gpus) > 1 else ()
    return RunningJob(
        jid, "ben", 0, gpus[0], dev, host, 0.0, stopping=stopping, gpus=len(gpus), gang=gang
    )


def _decide(
    pending: list[PendingJob],
    running: list[RunningJob],
    node: NodeState = NODE,
    config: PolicyConfig | None = None,
) -> Decision:
    return decide(100.0, pending, running, node, {}, config or PolicyConfig(drain=False))


def test_a_gang_on_a_node_with_two_free_gpus_gets_both() -> None:
    node = NodeState((Gpu(0, H100), Gpu(1, H100)), 512 * GIB)
    d = _decide([_p("g", 20, gpus=2)], [], node)
    assert d.start == (Start("g", 0, 1),)  # the first GPU, and its link share
    assert d.gangs == {"g": (0, 1)}


def test_a_gang_takes_the_best_fitting_gpus() -> None:
    # free: GPU 0 10 GiB, GPU 1 50 GiB, GPU 2 80 GiB: 20 GiB ranks fit on GPUs 1 and 2
    d = _decide([_p("g", 20, gpus=2)], [_r("a", (0,), 70), _r("b", (1,), 30)])
    assert d.gangs == {"g": (1, 2)}
    assert d.start == (Start("g", 1, 2),)  # GPU 1's link is shared with b


def test_with_one_gpu_free_a_gang_of_two_waits_holding_nothing() -> None:
    node = NodeState((Gpu(0, H100), Gpu(1, H100)), 512 * GIB)
    d = _decide([_p("g", 20, gpus=2), _p("s", 20)], [_r("busy", (1,), 70)], node)
    assert [s.job_id for s in d.start] == ["s"]  # GPU 0 stays free for others
    assert d.gangs == {} and d.held == {}
    assert d.kinds["g"] == WaitKind.resources
    assert d.reasons["g"] == (
        "resources: needs 2 GPUs with 20.0 GiB free on one node; 1 has it (GPU 0)"
    )


def test_two_gangs_of_two_on_three_gpus_one_runs_and_the_other_claims_nothing() -> None:
    d = _decide([_p("first", 60, gpus=2), _p("second", 60, gpus=2)], [])
    assert [s.job_id for s in d.start] == ["first"]
    assert d.gangs == {"first": (0, 1)}
    assert "second" not in d.gangs and "second" not in d.held
    assert d.reasons["second"] == (
        "resources: needs 2 GPUs with 60.0 GiB free on one node; 1 has it (GPU 2)"
    )
    # the next round, with the first running: still nothing for the second
    running = [_r("first", (0, 1), 60)]
    d = _decide([_p("second", 60, gpus=2)], running)
    assert d.start == () and d.gangs == {}


def test_a_running_gang_holds_its_budget_on_each_gpu_and_its_host_budget_once() -> None:
    node = NodeState(tuple(Gpu(i, H100) for i in range(3)), 100 * GIB)
    running = [_r("g", (0, 2), 70, host_gib=60)]
    d = _decide([_p("a", 20, host_gib=30)], running, node)
    assert d.start == (Start("a", 1, 1),)  # GPUs 0 and 2 have 10 GiB left
    d = _decide([_p("b", 20, host_gib=41)], running, node)  # 40 GiB of host left, not 100 - 120
    assert d.reasons["b"] == (
        "resources: needs 41.0 GiB of host memory, 40.0 GiB unreserved on the node"
    )


def test_a_gang_larger_than_the_node_says_how_many_gpus_it_has() -> None:
    node = NodeState((Gpu(0, H100),), 512 * GIB)
    d = _decide([_p("g", 20, gpus=2)], [], node)
    assert (
        d.reasons["g"] == "resources: needs 2 GPUs with 20.0 GiB each on one node; this node has 1"
    )


def test_an_exclusive_gang_needs_empty_gpus() -> None:
    d = _decide([_p("x", 20, gpus=2, exclusive=True)], [_r("a", (1,), 5)])
    assert d.gangs == {"x": (0, 2)}
    d = _decide([_p("x", 20, gpus=3, exclusive=True)], [_r("a", (1,), 5)])
    assert d.reasons["x"] == (
        "resources: needs 3 empty GPUs on one node for an exclusive job; 2 are empty (GPU 0, 2)"
    )


def test_the_first_blocked_gang_drains_all_the_gpus_it_needs() -> None:
    running = [_r("a", (0,), 70), _r("b", (1,), 70)]
    d = _decide([_p("g", 40, gpus=2), _p("s", 20)], running, config=PolicyConfig())
    assert d.reasons["g"].endswith("; GPU 2, 0 drain for it")  # most free first
    assert d.held == {"g": 2}
    # the small job fits only on a held GPU: it waits behind the gang
    assert d.start == ()
    assert d.kinds["s"] == WaitKind.priority


def test_a_cpu_node_pools_a_gangs_budgets() -> None:
    cpu = NodeState((), 64 * GIB)
    d = _decide([_p("g", 16, gpus=2, host_gib=16), _p("s", 16, host_gib=16)], [], cpu)
    assert d.start == (Start("g", None, 1),)  # 2 x 16 + 16 of 64 GiB; 16 + 16 do not fit
    assert d.reasons["s"] == (
        "resources: needs 32.0 GiB (device + host budgets), 16.0 GiB unreserved on the node"
    )
    running = [RunningJob("g", "ben", 0, None, 16 * GIB, 16 * GIB, 0.0, gpus=2)]
    d = _decide([_p("s", 8, host_gib=8)], running, cpu)
    assert d.start == (Start("s", None, 1),)


def test_a_gangs_quota_counts_its_device_budget_on_each_gpu() -> None:
    config = PolicyConfig(drain=False, quotas={"ana": Quota.from_gib(device_gib=100)})
    d = _decide([_p("g", 60, gpus=2)], [], config=config)
    assert d.reasons["g"] == "quota: the job needs 120 device GiB, more than the owner's 100"


def test_a_gang_is_charged_for_each_of_its_gpus() -> None:
    one = running_weight(_r("a", (0,), 20), NODE)
    assert running_weight(_r("g", (0, 1), 20), NODE) == 2 * one


def test_a_higher_class_job_preempts_a_gang_from_one_of_its_gpus() -> None:
    # the gang's 60 GiB of host come back once: 40 free + 60 >= 90
    node = NodeState((Gpu(0, H100), Gpu(1, H100)), 100 * GIB)
    low = RunningJob("g", "ben", -10, 0, 70 * GIB, 60 * GIB, 0.0, gpus=2, gang=(0, 1))
    high = PendingJob("h", "ana", 10, 0.0, 70 * GIB, 90 * GIB)
    d = _decide([high], [low], node)
    assert d.preempt == ("g",)
    assert d.reasons["h"] == "preemption: stopping 1 job of class -10 on GPU 0"
