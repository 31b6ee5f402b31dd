"""Jobs already dumped to JSON, by id and revision, for the API's reads of unchanged jobs.

Used by store/job_reads.py: `JobStore.get_json` and `list_json` answer from it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from wstrain.contracts.jobs import Job


class Parsed(NamedTuple):
    rev: int
    owner: str
    job_json: str  # with its plan, as GET /v1/jobs/{id} answers
    listed_json: str  # without: as a page lists it


class ParsedJobs:
    """Jobs already dumped to JSON, by id and revision (every write to a job bumps its
    `rev`): a job read again unchanged costs one HGET instead of parsing its spec and plan
    and dumping them again, which was most of a listing's CPU (bench/api_load.py). Strings
    only, so the cache adds nothing for the garbage collector to walk (1,000 parsed jobs
    made each full collection 60-120 ms). Bounded; one per store, so per process."""

    def __init__(self, max_jobs: int = 4096) -> None:
        self.max_jobs = max_jobs
        self._jobs: OrderedDict[str, Parsed] = OrderedDict()

    def get(self, job_id: str, rev: int) -> Parsed | None:
        hit = self._jobs.get(job_id)
        if hit is None or hit.rev != rev:
            return None
        self._jobs.move_to_end(job_id)
        return hit

    def put(self, job: Job) -> Parsed:
        listed = job.model_copy(update={"plan": None}).model_dump_json()
        parsed = Parsed(job.rev, job.owner, job.model_dump_json(), listed)
        self._jobs[job.id] = parsed
        self._jobs.move_to_end(job.id)
        while len(self._jobs) > self.max_jobs:
            self._jobs.popitem(last=False)
        return parsed
