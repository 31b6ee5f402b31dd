"""Load on the API over loopback: a private Redis, a real uvicorn running the API, N jobs in
the store, C concurrent clients mixing list / get / submit for a bounded time. Reports
requests per second, latency percentiles and errors as one JSON row.

    python -m bench.api_load --jobs 1000 --clients 20 --rate 200 --seconds 60 \
        --out bench/results/<f>.json

With --rate the clients together offer that many requests a second on a fixed timetable
(open loop, as wrk2 and k6's constant-arrival-rate do) and each latency counts from the
request's scheduled time, so a slow answer also delays, and is charged to, the requests
queued behind it. Without --rate each client sends as fast as it is answered (closed loop:
the throughput ceiling, where latency is just concurrency over throughput).

Needs the service's dependencies (the project installed), not a GPU. Every request is
checked: a status other than the route's success code counts as an error.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from wstrain.cli.serve import free_port, start_redis
from wstrain.contracts.jobs import Node
from wstrain.store import JobStore

REPO = Path(__file__).resolve().parents[1]


def _spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"preset": "micro-llama"},
        "data": {"kind": "synthetic"},
        "seq_len": 32,
        "global_batch": 4,
        "steps": 10,
        "precision": "fp32",
        "budget": {"device_gib": 1, "host_gib": 2},
    }


async def _seed(url: str, jobs: int, owners: list[str]) -> list[str]:
    """Submit `jobs` jobs through the API itself (as users would), 16 at a time."""
    ids: list[str] = []
    sem = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:

        async def one(i: int) -> None:
            async with sem:
                r = await c.post(
                    "/v1/jobs",
                    json=_spec(f"seed-{i}"),
                    headers={"X-Wstrain-Owner": owners[i % len(owners)]},
                )
                r.raise_for_status()
                ids.append(r.json()["id"])

        await asyncio.gather(*(one(i) for i in range(jobs)))
    return ids


async def _load(
    url: str,
    ids: list[str],
    owners: list[str],
    clients: int,
    seconds: float,
    rate: float | None = None,
) -> dict[str, Any]:
    latencies: dict[str, list[float]] = {"list": [], "get": [], "submit": []}
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    async def client(k: int) -> None:
        rng = random.Random(k)
        owner = owners[k % len(owners)]
        headers = {"X-Wstrain-Owner": owner}
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as c:
            n = 0
            period_s = clients / rate if rate else 0.0
            due = time.perf_counter() + rng.random() * period_s  # spread the clients
            while time.monotonic() < deadline:
                kind = rng.choices(["list", "get", "submit"], weights=[45, 45, 10])[0]
                if rate:
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    t0, due = due, due + period_s  # latency from the scheduled send
                else:
                    t0 = time.perf_counter()
                if kind == "list":
                    params: dict[str, Any] = {"limit": 50}
                    if rng.random() < 0.5:
                        params["owner"] = owner
                    if rng.random() < 0.3:
                        params["state"] = "queued"
                    r = await c.get("/v1/jobs", params=params)
                    ok = r.status_code == 200
                elif kind == "get":
                    r = await c.get(f"/v1/jobs/{rng.choice(ids)}")
                    ok = r.status_code == 200
                else:
                    r = await c.post("/v1/jobs", json=_spec(f"load-{k}-{n}"))
                    ok = r.status_code == 201
                latencies[kind].append(time.perf_counter() - t0)
                if not ok:
                    errors.append(f"{kind} {r.status_code} {r.text[:120]}")
                n += 1

    start = time.monotonic()
    await asyncio.gather(*(client(k) for k in range(clients)))
    elapsed = time.monotonic() - start
    every = sorted(x for v in latencies.values() for x in v)

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else 0.0

    return {
        "requests": len(every),
        "seconds": elapsed,
        "rps": len(every) / elapsed,
        "p50_ms": pct(every, 0.50),
        "p99_ms": pct(every, 0.99),
        "max_ms": every[-1] * 1e3 if every else 0.0,
        "by_kind": {
            k: {
                "count": len(v),
                "p50_ms": pct(sorted(v), 0.5),
                "p99_ms": pct(sorted(v), 0.99),
                "mean_ms": statistics.fmean(v) * 1e3 if v else 0.0,
            }
            for k, v in latencies.items()
        },
        "errors": len(errors),
        "error_samples": errors[:5],
    }


def run(
    jobs: int, clients: int, seconds: float, rate: float | None = None, workers: int = 1
) -> dict[str, Any]:
    """Start Redis and the API, seed the store, run the load; stops everything it started."""
    with tempfile.TemporaryDirectory() as tmp:
        redis_port, api_port = free_port(), free_port()
        redis_proc = start_redis(Path(tmp), redis_port)
        env = dict(os.environ)
        env.update(
            WSTRAIN_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
            WSTRAIN_KEY_PREFIX="load",
            WSTRAIN_LISTEN_PORT=str(api_port),
            WSTRAIN_WORKERS=str(workers),
        )
        api = subprocess.Popen(
            [sys.executable, "-m", "wstrain.api.app"],
            env=env,
            cwd=REPO,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{api_port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or api.poll() is not None:
                    raise RuntimeError("the API did not start")
                time.sleep(0.1)
            register_node(f"redis://127.0.0.1:{redis_port}/0", "load", "load-node", 64 << 30)
            owners = [f"user{i}" for i in range(10)]
            t0 = time.monotonic()
            ids = asyncio.run(_seed(url, jobs, owners))
            seed_s = time.monotonic() - t0
            # the load generator shares the machine: its own collector pauses (up to 130 ms
            # with the seeding's objects) would be charged to the API's latency
            gc.collect()
            gc.freeze()
            row = asyncio.run(_load(url, ids, owners, clients, seconds, rate))
        finally:
            api.terminate()
            api.wait(30)
            redis_proc.terminate()
            redis_proc.wait(10)
    return {
        "name": "api-load",
        "jobs_in_store": jobs,
        "clients": clients,
        "offered_rps": rate,
        "api_workers": workers,
        "mix": "45% list (half by owner, 30% by state), 45% get, 10% submit",
        "seed_seconds": seed_s,
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
        "python": platform.python_version(),
        **row,
    }


def register_node(redis_url: str, prefix: str, name: str, host_bytes: int) -> None:
    """A CPU node heartbeated as an agent does (for a day), so submissions check budgets
    against it while no agent runs: jobs stay queued, as in a busy queue. The tests'
    api_only fixture uses it too."""

    async def hold() -> None:
        store = JobStore.from_url(redis_url, prefix)
        node = Node(
            name=name,
            device="cpu",
            gpus=[],
            host_total_bytes=host_bytes,
            host_free_bytes=host_bytes,
            slots=1,
            running=[],
            profile={"matmul_flops": 1e10},
            heartbeat_at=time.time(),
        )
        assert await store.hold_node(node, ttl_s=86400) is None
        await store.close()

    asyncio.run(hold())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rate", type=float, help="offered requests/s in all (open loop)")
    p.add_argument("--workers", type=int, default=1, help="API processes (WSTRAIN_WORKERS)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    row = run(args.jobs, args.clients, args.seconds, args.rate, args.workers)
    print(json.dumps(row, indent=2))
    if args.out:
        args.out.write_text(json.dumps([row], indent=2) + "\n")


if __name__ == "__main__":
    main()
