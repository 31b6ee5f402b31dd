"""The decision round (policy/decide.py): fair share picks who gets scarce room,
backfill with the drain hold, every waiting job has a reason of its kind, and the round is
a pure function of its inputs.

    pytest tests/policy/test_decide.py
"""

from __future__ import annotations

from wstrain.contracts.calibration import GIB
from wstrain.policy import (
    Gpu,
    NodeState,
    PendingJob,
    PolicyConfig,
    RunningJob,
    Start,
    Usage,
    WaitKind,
    decide,
)

NODE = NodeState((Gpu(0, 141 * GIB), Gpu(1, 141 * GIB)), 1024 * GIB)


def _p(
    jid: str,
    owner: str,
    dev_gib: float,
    submitted_s: float = 0.0,
    priority: int = 0,
    exclusive: bool = False,
) -> PendingJob:
    return PendingJob(jid, owner, priority, submitted_s, int(dev_gib * GIB), 8 * GIB, exclusive)


def _r(jid: str, gpu: int, dev_gib: float, owner: str = "chen") -> RunningJob:
    return RunningJob(jid, owner, 0, gpu, int(dev_gib * GIB), 8 * GIB, 0.0)


def test_fair_share_gives_the_last_hole_to_the_owner_who_used_less() -> None:
    running = [_r("r0", 0, 141), _r("r1", 1, 101)]
    usage = {"ana": Usage(7200.0, 0.0), "ben": Usage(3600.0, 0.0)}
    pending = [_p("a", "ana", 40, submitted_s=1.0), _p("b", "ben", 40, submitted_s=2.0)]
    d = decide(10.0, pending, running, NODE, usage)
    assert d.order == ("b", "a")
    assert d.start == (Start("b", 1, 2),)
    assert d.reasons["a"].startswith("resources: no GPU has 40.0 GiB free (largest free 0.0 GiB)")


def test_a_fitting_job_starts_past_one_that_does_not_fit() -> None:
    # 'big' heads the queue and fits nowhere; 'small' behind it fits beside r0
    running = [_r("r0", 0, 100), _r("r1", 1, 12)]
    pending = [_p("big", "ana", 141, exclusive=True), _p("small", "ana", 12, submitted_s=1.0)]
    d = decide(10.0, pending, running, NODE, {})
    assert d.start == (Start("small", 0, 2),)
    # 'big' holds the emptiest GPU, 1, so it drains for it
    assert d.held == {"big": 1}
    assert d.reasons["big"] == (
        "resources: no GPU is empty for an exclusive job (the emptiest holds 1 job); "
        "GPU 1 drains for it"
    )


def test_nothing_new_lands_on_the_draining_gpu() -> None:
    running = [_r("r0", 0, 135), _r("r1", 1, 12)]
    pending = [_p("big", "ana", 141, exclusive=True), _p("small", "ana", 12, submitted_s=1.0)]
    d = decide(10.0, pending, running, NODE, {})
    assert d.start == ()
    assert d.kinds["small"] == WaitKind.priority
    assert d.reasons["small"] == "priority: 1 job ahead; GPU 1 drains for big"
    # plain backfill fills the hole instead
    d = decide(10.0, pending, running, NODE, {}, PolicyConfig(drain=False))
    assert d.start == (Start("small", 1, 2),)
    assert d.held == {}


def test_only_the_first_blocked_job_drains_a_gpu() -> None:
    running = [_r("r0", 0, 130), _r("r1", 1, 130)]
    pending = [_p("x", "ana", 141, exclusive=True), _p("y", "ana", 141, 1.0, exclusive=True)]
    d = decide(10.0, pending, running, NODE, {})
    assert list(d.held) == ["x"]
    assert "drains" not in d.reasons["y"]


def test_a_job_that_can_never_fit_holds_nothing() -> None:
    d = decide(10.0, [_p("huge", "ana", 300), _p("s", "ana", 12, 1.0)], [], NODE, {})
    assert d.held == {}
    assert [s.job_id for s in d.start] == ["s"]


def test_every_waiting_job_has_a_reason_that_names_its_kind() -> None:
    running = [_r("r0", 0, 141), _r("r1", 1, 120)]
    pending = [
        _p("a", "ana", 12),
        _p("b", "ben", 40, 1.0),
        PendingJob("c", "ana", 0, 2.0, 12 * GIB, 8 * GIB, not_before_s=50.0, retries=1),
        PendingJob("d", "ben", 0, 3.0, 12 * GIB, 8 * GIB, after=("0123456789ab",)),
    ]
    d = decide(10.0, pending, running, NODE, {})
    started = {s.job_id for s in d.start}
    assert started == {"a"}
    assert set(d.reasons) == {"b", "c", "d"}
    for job_id, text in d.reasons.items():
        assert text.startswith(d.kinds[job_id].value + ": ")
    assert set(d.order) == {"a", "b", "c", "d"}


def test_the_round_is_a_pure_function_of_its_inputs() -> None:
    running = [_r("r0", 0, 100), _r("r1", 1, 12)]
    pending = [_p(f"j{i}", "ana" if i % 2 else "ben", 12 + 7 * i, float(i)) for i in range(8)]
    usage = {"ana": Usage(100.0, 0.0)}
    first = decide(10.0, pending, running, NODE, usage)
    again = decide(10.0, list(reversed(pending)), list(reversed(running)), NODE, usage)
    assert first == again


def test_a_wait_reason_names_another_owners_job_by_class_not_id() -> None:
    # as test_nothing_new_lands_on_the_draining_gpu, but 'small' is ben's: ana's job id is
    # not his to see
    running = [_r("r0", 0, 135), _r("r1", 1, 12)]
    pending = [_p("big", "ana", 141, exclusive=True), _p("small", "ben", 12, submitted_s=1.0)]
    d = decide(10.0, pending, running, NODE, {})
    assert d.start == ()
    assert d.reasons["small"] == (
        "priority: 1 job ahead; GPU 1 drains for another owner's job of priority 0"
    )
    assert "big" not in d.reasons["small"]
