"""The lab the queue simulation models (bench/queue_sim.py): one node of 8 GPUs of 141 GiB
(an H200's HBM as a round figure) and 2 TiB of host memory, 4 owners of equal share, one
quota, and a seeded 24-hour trace of their jobs, from small working-set fine-tunes to whole
H200s, with sweeps, dependencies, crashes and a cancellation.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from wstrain.contracts.calibration import GIB
from wstrain.policy import Gpu, NodeState, Quota

DAY_S = 86400.0
OWNERS = ("ana", "ben", "chen", "dara")
NODE = NodeState(tuple(Gpu(i, 141 * GIB) for i in range(8)), 2048 * GIB)
# dara's quota sits above her fair quarter of the node (2 GPUs, 282 GiB), so it binds when
# the others leave room, not when all four compete
QUOTAS = {"dara": Quota.from_gib(max_jobs=10, device_gib=400, host_gib=800)}
# (device GiB, host GiB, weight): a lab's mix, from a small fine-tune on the working set
# to a whole H200; host budgets hold the streamed weights and optimizer state
SIZES = ((12, 24, 0.30), (20, 32, 0.25), (40, 64, 0.20), (80, 96, 0.15), (141, 160, 0.10))


@dataclass(frozen=True)
class TraceJob:
    id: str
    owner: str
    priority: int
    submit_s: float
    device_bytes: int
    host_bytes: int
    exclusive: bool
    work_s: float  # run time to finish, from scratch
    after: tuple[str, ...] = ()
    crash_at_work_s: tuple[float, ...] = ()  # the worker dies when its progress reaches each
    cancel_s: float | None = None


def make_trace(seed: int = 20261125, jobs_per_owner: int = 80) -> list[TraceJob]:
    """Per owner: a sweep of 12 jobs in the first 10 minutes, the rest at uniform times over
    the day; budgets from SIZES (141 GiB and 5% of the others exclusive), work log-uniform
    30 min to 8 h, 5% in the scavenger class -10, 10% after an earlier job of the owner,
    4% crashing once. Then 2 urgent class-10 jobs per owner between 06:00 and 18:00, one job
    crashing past its retries and one cancelled, each with a dependent job."""
    rng = random.Random(seed)
    jobs: list[TraceJob] = []

    def new_id() -> str:
        return f"{len(jobs) + 1:012x}"

    for owner in OWNERS:
        times = sorted(
            [rng.uniform(0, 600) for _ in range(12)]
            + [rng.uniform(600, DAY_S) for _ in range(jobs_per_owner - 12)]
        )
        mine: list[TraceJob] = []
        for t in times:
            dev, host, _ = rng.choices(SIZES, weights=[s[2] for s in SIZES])[0]
            work = math.exp(rng.uniform(math.log(1800), math.log(8 * 3600)))
            recent = [j for j in mine if t - j.submit_s < 4 * 3600]
            job = TraceJob(
                new_id(),
                owner,
                -10 if rng.random() < 0.05 else 0,
                t,
                dev * GIB,
                host * GIB,
                dev == 141 or rng.random() < 0.05,
                work,
                after=(rng.choice(recent).id,) if recent and rng.random() < 0.10 else (),
                crash_at_work_s=(rng.uniform(0.1, 0.9) * work,) if rng.random() < 0.04 else (),
            )
            mine.append(job)
            jobs.append(job)
        for _ in range(2):
            dev, host = rng.choice(((80, 96), (141, 160)))
            jobs.append(
                TraceJob(
                    new_id(),
                    owner,
                    10,
                    rng.uniform(6 * 3600, 18 * 3600),
                    dev * GIB,
                    host * GIB,
                    dev == 141,
                    rng.uniform(3600, 7200),
                )
            )
    # one job dying past its 2 retries and one its owner cancels, each with a dependent
    # that can then never start
    doomed = TraceJob(
        new_id(),
        "ben",
        0,
        3600.0,
        20 * GIB,
        32 * GIB,
        False,
        7200.0,
        crash_at_work_s=(600.0, 1300.0, 2000.0),
    )
    jobs.append(doomed)
    cancelled = TraceJob(
        new_id(), "chen", 0, 5400.0, 12 * GIB, 24 * GIB, False, 7200.0, cancel_s=9000.0
    )
    jobs.append(cancelled)
    for parent in (doomed, cancelled):
        jobs.append(
            TraceJob(
                new_id(),
                parent.owner,
                0,
                parent.submit_s + 60,
                12 * GIB,
                24 * GIB,
                False,
                3600.0,
                after=(parent.id,),
            )
        )
    return sorted(jobs, key=lambda j: (j.submit_s, j.id))
