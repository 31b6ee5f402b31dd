"""The job store: every piece of job state, the queue, events and node heartbeats in Redis.

    store = JobStore.from_url("redis://127.0.0.1:6379/0", "wstrain", retry_s=300)

job_store.py holds the store and its writes, job_reads.py the reads it inherits (a job, a
page of jobs, events, counts), lua.py its atomic scripts, cache.py the API's cache of jobs
as JSON by revision.
"""

from wstrain.store.job_store import JobStore, Lease

__all__ = ["JobStore", "Lease"]
