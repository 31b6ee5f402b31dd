"""Settings of the API process (env prefix WSTRAIN_), built once in main() / create_app().

    WSTRAIN_REDIS_URL, WSTRAIN_KEY_PREFIX, WSTRAIN_STATE_DIR, WSTRAIN_DATA_ROOTS
                                      see settings.py
    WSTRAIN_API_TOKENS                JSON {token: owner} or {token: {"owner": .., "role":
                                      "user"|"admin"}}; empty turns auth off
    WSTRAIN_MAX_BODY_BYTES            largest request body read (1 MiB); larger: 413
    WSTRAIN_ACCESS_LOG                a log line per request (false)
    WSTRAIN_WORKERS                   API processes sharing the port (1)
    WSTRAIN_LISTEN_HOST, _PORT        where `wstrain-api` listens (127.0.0.1, 8000)
    WSTRAIN_PLAN_TIMEOUT_S            deadline of a submission's checks and planning; a
                                      planner process past it is killed (2.0, at most 600)
    WSTRAIN_PLAN_PROCESSES            planner processes (2, 1-64)
    WSTRAIN_PLAN_QUEUE_PER_OWNER      an owner's plans waiting behind its one in planning;
                                      more: 429 with Retry-After (8, 0-1024)
    WSTRAIN_PLAN_REFUSAL_TTL_S        a spec that overran the deadline is refused at once
                                      this long (600, 0-86400; 0: never)
    WSTRAIN_PLAN_MEMORY_BYTES         heap of one planner process; past it 422 (4 GiB,
                                      256 MiB-1 TiB)
    WSTRAIN_METRICS_LEASE_S           how long one replica stays the store-wide exporter (30)
    WSTRAIN_METRICS_ENDED_WINDOW_S    how long an ended job stays in wstrain_job_info (86400)
    WSTRAIN_METRICS_MAX_JOBS          most jobs in wstrain_job_info, newest first (10000)
    WSTRAIN_LOG_FOLLOWERS_MAX         concurrent `logs?follow=true` streams per API process;
                                      more: 429 (64)
    WSTRAIN_LOG_KEEPALIVE_S           a comment line this often on a quiet log stream (15)

Read them with `ServiceSettings()`; `wstrain-api` (app.main) does, once.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from wstrain.settings import SharedSettings


class Role(StrEnum):
    user = "user"  # sees and acts on its own jobs
    admin = "admin"  # sees and acts on every owner's jobs


class TokenGrant(BaseModel):
    """Who a bearer token speaks for."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    owner: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._@-]+$")
    role: Role = Role.user


class ServiceSettings(SharedSettings):
    # {token: owner} is shorthand for {token: {"owner": owner, "role": "user"}}
    api_tokens: dict[str, TokenGrant | str] = Field(default_factory=dict)
    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)
    workers: int = Field(default=1, ge=1, le=64)  # API processes sharing the port
    access_log: bool = False  # uvicorn's line per request (the request metrics count them)
    # listen_*, not host/port: Kubernetes sets <SERVICE>_PORT=tcp://... for a Service named
    # wstrain, which WSTRAIN_PORT would have to parse
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=8000, ge=0, le=65535)
    # The presets plan in 10-75 ms on one core, but a token file's check reads it whole: 45 ms
    # a GiB from the page cache, 2 s a GiB from a 500 MB/s disk. So 2 s passes every preset
    # and small corpora; where jobs train on many-GiB token files, raise it.
    # Bounded: a planner process holds a core for up to this long per request.
    plan_timeout_s: float = Field(default=2.0, gt=0, le=600)
    # Planner processes (api/planning.py). An owner plans one spec at a time, so with 2 one
    # owner's deadline-long plan never holds the only process: another owner's plan starts
    # at once. Each is ~35 MiB, forked from one ~50 MiB zygote that imported numpy,
    # pydantic and the planner (no torch).
    plan_processes: int = Field(default=2, ge=1, le=64)
    # an owner's plans waiting behind its one being planned; more: 429 with Retry-After.
    # 8 lets a sweep script submit 8 at once; it drains at one plan per 10-75 ms for presets
    plan_queue_per_owner: int = Field(default=8, ge=0, le=1024)
    # how long a spec that overran plan_timeout_s is refused at once without planning again
    # (0: never); 10 min outlasts a retry loop, and a changed data file is planned anew then
    plan_refusal_ttl_s: float = Field(default=600.0, ge=0, le=86400)
    # heap of one planner process (RLIMIT_DATA; token files are mapped outside it): every
    # preset plans in under 80 MiB of it (64 MiB is the imports), while seq_len 2^20 on
    # tiny-llama passes 256 MiB in 4 s and grows on, so a raised deadline cannot turn into
    # an API host out of memory
    plan_memory_bytes: int = Field(default=4 << 30, ge=256 << 20, le=1 << 40)
    # /metrics: the replica holding the exporter lease exports the store-wide series; another
    # takes over this long after the holder's last scrape (3 scrapes at Prometheus's 10 s)
    metrics_lease_s: float = Field(default=30.0, ge=1, le=3600)
    # ended jobs keep their wstrain_job_info/_state series this long (a day of history in
    # the queue table), and at most metrics_max_jobs jobs are exported, newest first
    metrics_ended_window_s: float = Field(default=86400.0, ge=0, le=30 * 86400)
    metrics_max_jobs: int = Field(default=10000, ge=1, le=100000)
    # Each follower of a job's log holds a Redis connection in XREAD BLOCK and a socket;
    # 64 per process is far more people than watch one lab's jobs at once, and bounds both.
    log_followers_max: int = Field(default=64, ge=1, le=10000)
    # Proxies and load balancers cut idle connections after 30-60 s (nginx: 60 s); a comment
    # every 15 s keeps a quiet log stream open through them.
    log_keepalive_s: float = Field(default=15.0, ge=0.05, le=300)

    def grant(self, token: str) -> TokenGrant | None:
        """The grant of a bearer token, None for an unknown one."""
        found = self.api_tokens.get(token)
        if isinstance(found, str):
            return TokenGrant(owner=found)
        return found
