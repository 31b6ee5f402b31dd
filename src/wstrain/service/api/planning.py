"""The one way the API validates and plans a JobSpec (POST /v1/jobs and POST /v1/plans): in
a worker thread, off the event loop, under the deadline WSTRAIN_PLAN_TIMEOUT_S.

validate_and_plan (service/validation.py) is CPU-bound: the planner's search takes 10-75 ms
for the presets, and the data checks read the token file's head and every JSONL line. Run on the
event loop it would stall every other request, /healthz included, for that long. Here it
runs in a small pool of its own:

    planner = Planner(timeout_s=2.0, access=settings.access())  # create_app's lifespan
    plan = await planner.plan(spec, await store.nodes())   # InvalidSpec (422) past 2 s
    planner.close()

A check past its deadline answers 422 at once, but its thread runs on to the end: Python
cannot stop a thread, and a half-run check has no side effect worth stopping for (it only
reads). A check still queued when its deadline passes never starts.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from wstrain.scheduler.contracts.access import DataAccess
from wstrain.scheduler.contracts.errors import InvalidSpec
from wstrain.scheduler.contracts.jobs import Node
from wstrain.scheduler.contracts.plan import Plan
from wstrain.scheduler.contracts.spec import JobSpec
from wstrain.service.validation import validate_and_plan

log = logging.getLogger(__name__)

# Planning is pure Python under the GIL, so more threads plan no faster; 4 lets up to 3
# checks that overran their deadline run on without queueing the next submission. A thread
# that runs on still shares the GIL with the event loop, which gets it back every 5 ms (the
# switch interval): two 422s and two /healthz answer in 30-130 ms while a 0.7 s plan runs
# (tests/service/test_planning_deadline.py). Their own pool rather than asyncio.to_thread's
# default executor, which also resolves host names for new Redis connections, and rather
# than anyio's to_thread, whose abandoned threads release their limiter slot and so are not
# bounded at all.
PLAN_THREADS = 4


class Planner:
    """validate_and_plan in PLAN_THREADS threads, each call under `timeout_s` seconds."""

    def __init__(self, timeout_s: float, access: DataAccess, threads: int = PLAN_THREADS) -> None:
        self.timeout_s = timeout_s
        self.access = access
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="wstrain-plan")

    async def plan(self, spec: JobSpec, nodes: list[Node]) -> Plan:
        """The plan validate_and_plan makes, or its InvalidSpec / InfeasibleBudget; InvalidSpec
        naming the fix when it takes longer than `timeout_s`."""
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._pool, validate_and_plan, spec, nodes, self.access)
        try:
            done, _ = await asyncio.wait({work}, timeout=self.timeout_s)
        finally:
            # A no-op once done; drops a check that has not started (its deadline passed, or
            # this request was cancelled); a running one runs on (see the module docstring).
            work.cancel()
        if work not in done:
            log.warning("spec %s: checks and planning overran %s s", spec.name, self.timeout_s)
            raise InvalidSpec(
                f"planning took too long (over {self.timeout_s} s); the API checks the "
                "data and plans both runtimes within "
                "WSTRAIN_PLAN_TIMEOUT_S: use a smaller data file, set overrides.runtime to "
                "plan one runtime, or raise WSTRAIN_PLAN_TIMEOUT_S on the API",
                timeout_s=self.timeout_s,
            )
        return work.result()

    def close(self) -> None:
        """Stop taking checks and drop queued ones; running ones finish in their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)
