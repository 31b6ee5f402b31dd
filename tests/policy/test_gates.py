"""The gates before placement (policy/gates.py through `decide`): quotas with
their reasons (counting this round's starts and jobs on other nodes), dependencies (waiting,
and unsatisfiable once one fails) and the retry back-off.

    pytest tests/policy/test_gates.py
"""

from __future__ import annotations

from wstrain.contracts.calibration import GIB
from wstrain.contracts.jobs import JobState
from wstrain.policy import (
    Gpu,
    NodeState,
    PendingJob,
    PolicyConfig,
    Quota,
    RunningJob,
    WaitKind,
    decide,
)

NODE = NodeState(tuple(Gpu(i, 141 * GIB) for i in range(4)), 2048 * GIB)
A, B, C = "0000000000a1", "0000000000b2", "0000000000c3"


def _p(
    jid: str,
    dev_gib: float = 12,
    submitted_s: float = 0.0,
    after: tuple[str, ...] = (),
    not_before_s: float | None = None,
    retries: int = 0,
) -> PendingJob:
    dev, host = int(dev_gib * GIB), 16 * GIB
    return PendingJob(jid, "ana", 0, submitted_s, dev, host, False, after, not_before_s, retries)


def _r(jid: str, dev_gib: float, gpu: int | None = 0) -> RunningJob:
    return RunningJob(jid, "ana", 0, gpu, int(dev_gib * GIB), 16 * GIB, 0.0)


def test_quota_on_jobs_running() -> None:
    config = PolicyConfig(quotas={"ana": Quota(max_jobs=3)})
    running = [_r("r1", 12), _r("r2", 12), _r("r3", 12)]
    d = decide(0.0, [_p("a")], running, NODE, {}, config)
    assert d.start == ()
    assert d.reasons["a"] == "quota: 3 of 3 jobs running"
    assert d.kinds["a"] == WaitKind.quota


def test_quota_on_device_gib_names_what_the_job_needs() -> None:
    config = PolicyConfig(quotas={"ana": Quota.from_gib(device_gib=48)})
    d = decide(0.0, [_p("a", 12)], [_r("r1", 20), _r("r2", 20)], NODE, {}, config)
    assert d.reasons["a"] == "quota: 40 of 48 device GiB reserved, the job needs 12"
    d = decide(0.0, [_p("a", 50)], [], NODE, {}, config)
    assert d.reasons["a"] == "quota: the job needs 50 device GiB, more than the owner's 48"


def test_quota_on_host_gib() -> None:
    config = PolicyConfig(quotas={"ana": Quota.from_gib(host_gib=40)})
    d = decide(0.0, [_p("a")], [_r("r1", 12), _r("r2", 12)], NODE, {}, config)
    assert d.reasons["a"] == "quota: 32 of 40 host GiB reserved, the job needs 16"


def test_quota_counts_the_jobs_started_earlier_in_the_round() -> None:
    config = PolicyConfig(quotas={"ana": Quota(max_jobs=2)})
    pending = [_p("a", submitted_s=1), _p("b", submitted_s=2), _p("c", submitted_s=3)]
    d = decide(10.0, pending, [], NODE, {}, config)
    assert [s.job_id for s in d.start] == ["a", "b"]
    assert d.reasons["c"] == "quota: 2 of 2 jobs running"


def test_quota_counts_jobs_on_other_nodes() -> None:
    config = PolicyConfig(quotas={"ana": Quota(max_jobs=1)})
    d = decide(0.0, [_p("a")], [], NODE, {}, config, elsewhere=[_r("far", 12, gpu=5)])
    assert d.reasons["a"] == "quota: 1 of 1 jobs running"


def test_other_owners_are_not_held_to_a_quota() -> None:
    config = PolicyConfig(quotas={"ben": Quota(max_jobs=0)})
    d = decide(0.0, [_p("a")], [], NODE, {}, config)
    assert [s.job_id for s in d.start] == ["a"]


def test_a_dependency_still_running_makes_the_job_wait() -> None:
    states = {A: JobState.succeeded, B: JobState.running}
    d = decide(0.0, [_p("a", after=(A, B))], [], NODE, {}, None, states)
    assert d.start == ()
    assert d.reasons["a"] == f"dependency: waiting on {B} (running)"
    assert d.kinds["a"] == WaitKind.dependency
    assert d.unsatisfiable == ()


def test_a_failed_dependency_makes_the_job_unsatisfiable() -> None:
    states = {A: JobState.running, B: JobState.failed}
    d = decide(0.0, [_p("a", after=(A, B))], [], NODE, {}, None, states)
    assert d.reasons["a"] == f"dependency: {B} failed"
    assert d.unsatisfiable == ("a",)
    states = {A: JobState.cancelled}
    d = decide(0.0, [_p("a", after=(A,))], [], NODE, {}, None, states)
    assert d.reasons["a"] == f"dependency: {A} was cancelled"
    d = decide(0.0, [_p("a", after=(C,))], [], NODE, {}, None, {})
    assert d.reasons["a"] == f"dependency: {C} is unknown"
    assert d.unsatisfiable == ("a",)


def test_the_job_starts_once_every_dependency_succeeded() -> None:
    states = {A: JobState.succeeded, B: JobState.succeeded}
    d = decide(0.0, [_p("a", after=(A, B))], [], NODE, {}, None, states)
    assert [s.job_id for s in d.start] == ["a"]


def test_back_off_waits_until_not_before() -> None:
    job = _p("a", not_before_s=130.0, retries=2)
    d = decide(100.0, [job], [], NODE, {})
    assert d.start == ()
    assert d.reasons["a"] == "back-off: retry 2 in 30 s"
    assert d.kinds["a"] == WaitKind.back_off
    d = decide(129.5, [job], [], NODE, {})
    assert d.reasons["a"] == "back-off: retry 2 in 1 s"
    d = decide(130.0, [job], [], NODE, {})
    assert [s.job_id for s in d.start] == ["a"]
