"""The one way the API validates and plans a JobSpec (POST /v1/jobs and POST /v1/plans): in
planner processes that can be stopped, one plan per owner at a time, under the deadline
WSTRAIN_PLAN_TIMEOUT_S.

    planner = Planner(settings.plan_timeout_s, settings.access(), processes=2, ...)
    await planner.start()                                     # create_app's lifespan
    plan = await planner.plan(spec, await store.nodes(), owner="alice")
    planner.close()

validate_and_plan (api/validation.py) is CPU-bound: 10-75 ms for the presets, but the
schema admits specs (seq_len 2^20, 1024 layers) that plan for minutes. So that no user can
stall another:
- each plan runs in a planner process (api/plan_pool.py); one still planning at the deadline
  is killed (SIGKILL, its CPU free at once), replaced by a fork of the zygote (~10 ms), and
  its caller answered 422; one that dies (the OOM killer, a stray kill) is replaced too,
  and the request it held runs once more;
- an owner has at most one plan in a process; its further requests wait behind it, FIFO, at
  most WSTRAIN_PLAN_QUEUE_PER_OWNER of them (beyond: 429 with Retry-After), and free
  processes go to the owners with waiting requests in turn (round robin), so one owner's
  flood delays another owner's plan by at most one plan's time, the deadline;
- a planner's heap is capped at WSTRAIN_PLAN_MEMORY_BYTES: a plan past it answers 422;
- a spec that overran (its JSON less `name`, with the node profile it plans against) is
  refused at once for WSTRAIN_PLAN_REFUSAL_TTL_S, without planning it again.
The event loop only waits: on futures, and on the planners' sockets (loop.add_reader).
One process of the API (WSTRAIN_WORKERS > 1 runs several) keeps its own planners, queues
and refusals.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from wstrain.api.plan_pool import (
    Bug,
    Died,
    Overran,
    Planned,
    PlannerProcess,
    Refused,
    Zygote,
    over_memory,
)
from wstrain.api.validation import pick_node
from wstrain.contracts.access import DataAccess
from wstrain.contracts.errors import InvalidSpec, TooManyRequests
from wstrain.contracts.jobs import Node
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec

log = logging.getLogger(__name__)

# Refusals remembered at once: each is a 32-byte digest and a time, so 4096 hold ~0.5 MiB
# however large the specs; the least recently refused is forgotten first.
REFUSALS_MAX = 4096
# A request whose planner process died under it (killed from outside, the OOM killer) runs
# once more on a fresh process; a spec that kills two in a row is refused.
ATTEMPTS = 2


class RefusalCache:
    """Specs that overran the deadline: a bounded LRU of digests, each kept `ttl_s`."""

    def __init__(self, ttl_s: float, max_entries: int = REFUSALS_MAX) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._at: OrderedDict[bytes, float] = OrderedDict()  # digest -> monotonic time

    @staticmethod
    def key(spec: JobSpec, nodes: list[Node]) -> bytes:
        """The spec less its name, and the node profile it is planned against."""
        try:
            node = repr(pick_node(spec, nodes))
        except InvalidSpec:  # too large for every node: the planner process says so
            node = "none"
        text = spec.model_dump_json(exclude={"name"}) + "\0" + node
        return hashlib.sha256(text.encode()).digest()

    def refused_at(self, key: bytes, now: float) -> float | None:
        """When `key` overran, if that was under `ttl_s` ago."""
        at = self._at.get(key)
        if at is None:
            return None
        if now - at >= self.ttl_s:
            del self._at[key]
            return None
        self._at.move_to_end(key)
        return at

    def add(self, key: bytes, now: float) -> None:
        if self.ttl_s <= 0:
            return
        self._at[key] = now
        self._at.move_to_end(key)
        while len(self._at) > self.max_entries:
            self._at.popitem(last=False)


def _settle(done: asyncio.Future[Plan], outcome: Plan | Exception) -> None:
    """Answer a request, unless its caller has gone (the future is cancelled)."""
    if done.done():
        return
    if isinstance(outcome, Exception):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)


@dataclass
class _Request:
    spec: JobSpec
    nodes: list[Node]
    key: bytes
    done: asyncio.Future[Plan]
    attempts: int = 0


@dataclass
class _Owners:
    """Who waits and who plans: owners in round-robin order, each with its FIFO."""

    waiting: OrderedDict[str, deque[_Request]] = field(default_factory=OrderedDict)
    planning: set[str] = field(default_factory=set)

    def next(self) -> tuple[str, _Request] | None:
        """The oldest request of the first owner in turn with none planning; that owner
        goes to the back of the turn."""
        for owner in self.waiting:
            if owner not in self.planning:
                queue = self.waiting.pop(owner)
                request = queue.popleft()
                if queue:
                    self.waiting[owner] = queue
                return owner, request
        return None

    def requeue_first(self, owner: str, request: _Request) -> None:
        self.waiting.setdefault(owner, deque()).appendleft(request)
        self.waiting.move_to_end(owner, last=False)

    def drop(self, owner: str, request: _Request) -> None:
        queue = self.waiting.get(owner)
        if queue is not None and request in queue:
            queue.remove(request)
            if not queue:
                del self.waiting[owner]


class Planner:
    """validate_and_plan in `processes` planner processes, each plan within `timeout_s`
    and `memory_bytes` of heap, one plan per owner at a time, `queue_per_owner` more
    waiting."""

    def __init__(
        self,
        timeout_s: float,
        access: DataAccess,
        processes: int = 2,
        queue_per_owner: int = 8,
        refusal_ttl_s: float = 600.0,
        memory_bytes: int = 4 << 30,
    ) -> None:
        self.timeout_s = timeout_s
        self.access = access
        self.processes = processes
        self.queue_per_owner = queue_per_owner
        self.memory_bytes = memory_bytes
        self.refusals = RefusalCache(refusal_ttl_s)
        self._idle: list[PlannerProcess] = []
        self._zygote: Zygote | None = None  # forks the planners (api/plan_pool.py)
        self._zygote_lock = asyncio.Lock()
        self._busy: set[PlannerProcess] = set()
        self._owners = _Owners()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def start(self) -> None:
        """Start the zygote (~0.5 s of imports) and fork the planner processes from it."""
        await asyncio.gather(*(self._start_one() for _ in range(self.processes)))

    async def plan(self, spec: JobSpec, nodes: list[Node], owner: str) -> Plan:
        """The plan validate_and_plan makes, or its InvalidSpec / InfeasibleBudget;
        InvalidSpec naming the fix when it overruns `timeout_s` (or overran lately);
        TooManyRequests when `owner` already has `queue_per_owner` plans waiting."""
        if self._closed:  # the API is shutting down: its planners are gone
            raise RuntimeError("the planner is closed; no plan is made while the API stops")
        key = RefusalCache.key(spec, nodes)
        at = self.refusals.refused_at(key, time.monotonic())
        if at is not None:
            raise self._overran(time.monotonic() - at)
        queue = self._owners.waiting.get(owner, ())
        if len(queue) + (owner in self._owners.planning) > self.queue_per_owner:
            retry_s = max(1, math.ceil(self.timeout_s))  # the queue moves one per deadline
            raise TooManyRequests(
                f"owner {owner!r} already has {len(queue)} plans waiting behind one being "
                f"planned, the most WSTRAIN_PLAN_QUEUE_PER_OWNER={self.queue_per_owner} "
                f"allows; retry after {retry_s} s, or submit fewer specs at once",
                retry_after_s=retry_s,
                queue_per_owner=self.queue_per_owner,
            )
        request = _Request(spec, nodes, key, asyncio.get_running_loop().create_future())
        self._owners.waiting.setdefault(owner, deque()).append(request)
        self._dispatch()
        try:
            return await request.done
        finally:  # the client went away while it waited: it never starts
            self._owners.drop(owner, request)

    def _overran(self, ago_s: float | None) -> InvalidSpec:
        when = (
            f"this spec (its name aside) overran {ago_s:.0f} s ago and is refused without "
            f"planning again for WSTRAIN_PLAN_REFUSAL_TTL_S={self.refusals.ttl_s:g} s"
            if ago_s is not None
            else "it was stopped, and the same spec (its name aside) is refused at once for "
            f"WSTRAIN_PLAN_REFUSAL_TTL_S={self.refusals.ttl_s:g} s"
        )
        return InvalidSpec(
            f"planning took too long (over {self.timeout_s} s); {when}. The API checks the "
            "data and plans both runtimes within WSTRAIN_PLAN_TIMEOUT_S: use a smaller "
            "data file, a shorter seq_len or fewer layers, set overrides.runtime to plan one "
            "runtime, or raise WSTRAIN_PLAN_TIMEOUT_S on the API",
            timeout_s=self.timeout_s,
        )

    def _dispatch(self) -> None:
        """Give idle processes to waiting owners, in turn."""
        while self._idle and not self._closed:
            # last in, first out: the process that just finished, whose plan cache
            # (validation.py's _PLANS) holds what its owner's sweep plans next
            slot = self._idle.pop()
            if not slot.alive():  # died while idle: replace it, try the next
                self._replace(slot)
                continue
            turn = self._owners.next()
            if turn is None:
                self._idle.append(slot)
                return
            owner, request = turn
            self._owners.planning.add(owner)
            self._busy.add(slot)
            self._spawn(self._run(slot, owner, request))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)  # held, so it is not collected mid-run
        task.add_done_callback(self._tasks.discard)

    async def _run(self, slot: PlannerProcess, owner: str, request: _Request) -> None:
        request.attempts += 1
        try:
            outcome = await slot.run(request.spec, request.nodes, self.timeout_s)
        except Exception as exc:  # a bug here: the process's state is unknown, replace it
            outcome = Bug(f"{type(exc).__name__}: {exc}")
        finally:
            self._busy.discard(slot)
            self._owners.planning.discard(owner)
        done = request.done
        if isinstance(outcome, Planned):
            self._idle.append(slot)
            _settle(done, outcome.plan)
        elif isinstance(outcome, Refused):
            if outcome.spent:  # it ran out of memory and exited
                self._replace(slot)
            else:
                self._idle.append(slot)
            _settle(done, outcome.error)
        elif isinstance(outcome, Overran):
            self._replace(slot)
            self.refusals.add(request.key, time.monotonic())
            log.warning(
                "spec %s: planning overran %s s; process %s killed",
                request.spec.name,
                self.timeout_s,
                slot.pid,
            )
            _settle(done, self._overran(None))
        elif isinstance(outcome, Died):
            self._replace(slot)
            log.warning("spec %s: planner %s died: %s", request.spec.name, slot.pid, outcome)
            if request.attempts < ATTEMPTS and not done.done():
                self._owners.requeue_first(owner, request)  # first in line, on a new one
            else:  # a second planner died on it: the OOM killer, most likely
                _settle(done, over_memory(self.memory_bytes))
        else:  # a bug: not the client's fault, and not retried
            self._replace(slot)
            log.error("spec %s: planner %s failed: %s", request.spec.name, slot.pid, outcome)
            _settle(done, RuntimeError(f"planning spec {request.spec.name!r} failed: {outcome}"))
        self._dispatch()

    def _replace(self, old: PlannerProcess) -> None:
        """Kill `old` now and fork its replacement (~10 ms) in the background."""
        old.kill()
        self._spawn(self._start_one())

    async def _start_one(self) -> None:
        """One more planner among the idle ones; the zygote started again if it died."""
        while not self._closed:
            try:
                async with self._zygote_lock:
                    if self._zygote is None or not self._zygote.alive():
                        if self._zygote is not None:
                            log.warning("the planner zygote exited; starting another")
                            self._zygote.close()
                        self._zygote = await Zygote.start(self.access, self.memory_bytes)
                zygote = self._zygote
                new = await zygote.fork()
            except (OSError, EOFError, RuntimeError, TimeoutError) as exc:
                log.warning("a planner process did not start (%r); retrying in 1 s", exc)
                await asyncio.sleep(1.0)
                continue
            if self._closed:
                new.kill()
            else:
                self._idle.append(new)
                self._dispatch()
            return

    def close(self) -> None:
        """Kill every planner process and fail the requests still waiting."""
        self._closed = True
        for slot in (*self._idle, *self._busy):
            slot.kill()
        if self._zygote is not None:
            self._zygote.close()
        self._idle.clear()
        self._busy.clear()
        for queue in self._owners.waiting.values():
            for request in queue:
                request.done.cancel()  # a no-op on a done one
        self._owners.waiting.clear()
        for task in self._tasks:
            task.cancel()
