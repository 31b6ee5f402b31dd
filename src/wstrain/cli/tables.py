"""The CLI's tables: `wstrain ls`, `wstrain status ID` and `wstrain queue`, drawn with `rich`
(colour on a terminal, plain columns in a pipe; `--json` prints the server's JSON instead),
and `wstrain presets` in plain columns.

    wstrain ls [--state running] [--owner alice] [--limit 50] [--json]
    wstrain status ID [--json]
    wstrain queue [--json]     # pending jobs in the order they will run, with the reason
                               # and when each is predicted to start ("starts in")
    wstrain presets            # sizes: 8.030B or 821.5K parameters, 59.8 GiB or 12.3 MiB

queue asks GET /v1/queue (positions and reasons from the scheduler). A server without that
route gets the queued jobs from GET /v1/jobs?state=queued, ordered as the store's queue
orders them (priority, then submission time), with each job's `state_reason`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import httpx
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from wstrain.cli.client import ApiError, call
from wstrain.cli.watch import STATE_STYLE, fmt_duration, fmt_loss, fmt_rate

PAGE_LIMIT = 500  # GET /v1/jobs's largest page
QUEUE_MAX_JOBS = 5000  # the fallback queue listing reads at most this many queued jobs
PIPE_WIDTH = 160  # a table written to a pipe or file: wide enough that rows do not wrap


def console() -> Console:
    """A console on stdout; in a pipe without $COLUMNS, PIPE_WIDTH wide, not rich's 80."""
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=PIPE_WIDTH if wide else None, highlight=False)


def _state(state: str) -> str:
    return f"[{STATE_STYLE.get(state, '')}]{state}[/]"


def _age(ts: float | None) -> str:
    return "-" if ts is None else fmt_duration(time.time() - ts)


def ls(c: httpx.Client, state: str | None, owner: str | None, limit: int, as_json: bool) -> int:
    params: dict[str, str | int] = {"limit": limit}
    params.update({k: v for k, v in (("state", state), ("owner", owner)) if v})
    listing = call(c, "GET", "/v1/jobs", params=params)
    if as_json:
        print(json.dumps(listing, indent=1))
        return 0
    table = Table(box=box.SIMPLE, show_edge=False)
    table.add_column("id", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("loss", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("ETA", justify="right")
    table.add_column("age", justify="right")
    table.add_column("gpu", no_wrap=True)  # "0,1": every GPU of a job on several
    table.add_column("owner")
    table.add_column("name", overflow="fold")
    for j in listing["jobs"]:
        live = j["state"] in ("running", "cancelling")
        table.add_row(
            j["id"],
            _state(j["state"]),
            f"{j['step']}/{j['steps']}",
            fmt_loss(j.get("loss")),
            fmt_rate(j.get("tokens_per_s")) if live else "-",
            fmt_duration(j.get("eta_s")) if live else "-",
            _age(j.get("created_at")),
            _fmt(j.get("gpu")),
            escape(j["owner"]),
            escape(j["name"]),
        )
    shown, total = len(listing["jobs"]), listing["total"]
    if shown < total:
        table.caption = f"{shown} of {total} jobs, newest first; --limit N shows more"
    console().print(table)
    return 0


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else escape(str(v))


def starts_in(at_s: float | None, now_s: float) -> str:
    """A predicted epoch time as the CLI shows it: "now", or how long until it ("-": none)."""
    if at_s is None:
        return "-"
    return "now" if at_s <= now_s + 1 else fmt_duration(at_s - now_s)


def _predicted(at_s: float | None, now_s: float) -> str:
    if at_s is None:
        return "-"
    clock = time.strftime("%Y-%m-%d %H:%M", time.localtime(at_s))
    return f"{clock} (in {starts_in(at_s, now_s)})" if at_s > now_s + 1 else f"{clock} (now)"


def status(c: httpx.Client, job_id: str, as_json: bool) -> int:
    job = call(c, "GET", f"/v1/jobs/{job_id}")
    if as_json:
        print(json.dumps(job, indent=1))
        return 0
    spec = job.get("spec") or {}
    rows = [
        ("id", job["id"]),
        ("name", escape(job["name"])),
        ("owner", escape(job["owner"])),
        ("state", _state(job["state"])),
        ("reason", _fmt(job.get("state_reason"))),
        ("step", f"{job['step']}/{job['steps']}"),
        ("loss", _fmt(job.get("loss"))),
        ("eval_loss", _fmt(job.get("eval_loss"))),
        ("epoch", _fmt(job.get("epoch"))),
        ("tokens", _fmt(job.get("tokens_seen"))),
        ("data pos", _fmt(job.get("data_position"))),
        ("tokens/s", _fmt(job.get("tokens_per_s"))),
        ("mfu", _fmt(job.get("mfu"))),
        ("eta", fmt_duration(job.get("eta_s"))),
        *(
            [
                ("predicted start", _predicted(job.get("predicted_start"), time.time())),
                ("predicted end", _predicted(job.get("predicted_end"), time.time())),
            ]
            if job.get("state") == "queued"
            else []
        ),
        ("attempt", _fmt(job.get("attempt"))),
        ("retries", _fmt(job.get("retries"))),
        ("priority", _fmt(spec.get("priority"))),
        ("group", _fmt(spec.get("group"))),
        ("node", _fmt(job.get("node"))),
        ("gpus", _fmt(spec.get("gpus", 1))),
        ("nodes", _fmt(spec.get("nodes", 1))),
        ("gpu", _fmt(job.get("gpu"))),
        ("age", _age(job.get("created_at"))),
        ("checkpoint", _fmt(job.get("last_checkpoint"))),
        ("error", f"[red]{_fmt(job['error'])}[/]" if job.get("error") else "-"),
    ]
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(justify="right", style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, str(value))
    console().print(table)
    return 0


def _queued_from_list(c: httpx.Client) -> list[dict[str, Any]]:
    """The queued jobs in queue order (priority first, then first come), as the store's
    queue scores them; for a server without GET /v1/queue."""
    jobs: list[dict[str, Any]] = []
    while len(jobs) < QUEUE_MAX_JOBS:
        params = {"state": "queued", "offset": len(jobs), "limit": PAGE_LIMIT}
        page = call(c, "GET", "/v1/jobs", params=params)
        jobs += page["jobs"]
        if not page["jobs"] or len(jobs) >= page["total"]:
            break
    jobs.sort(key=lambda j: (-(j.get("spec") or {}).get("priority", 0), j["created_at"]))
    for position, j in enumerate(jobs, 1):
        j["position"] = position
        j["priority"] = (j.get("spec") or {}).get("priority", 0)
    return jobs


def queue(c: httpx.Client, as_json: bool) -> int:
    try:
        body: dict[str, Any] = call(c, "GET", "/v1/queue")
        approximate = False
    except ApiError as exc:
        if exc.status != 404:
            raise
        queued = _queued_from_list(c)
        body, approximate = {"jobs": queued, "total": len(queued)}, True
    if as_json:
        print(json.dumps(body, indent=1))
        return 0
    jobs: list[dict[str, Any]] = body["jobs"]
    table = Table(box=box.SIMPLE, show_edge=False)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("id", no_wrap=True)
    table.add_column("prio", justify="right")
    table.add_column("share", justify="right")  # the owner's fair-share factor, 0..1
    table.add_column("waiting", justify="right")
    table.add_column("starts in", justify="right")  # the forecast: GET /v1/queue
    table.add_column("owner")
    table.add_column("name", overflow="fold")
    table.add_column("reason", overflow="fold")
    now_s = time.time()
    for j in jobs:
        factor = j.get("fair_share_factor")
        waited = j.get("wait_s")
        table.add_row(
            str(j.get("position", "-")),
            j["id"],
            str(j.get("priority", 0)),
            "-" if factor is None else f"{factor:.2f}",
            fmt_duration(waited) if waited is not None else _age(j.get("created_at")),
            starts_in(j.get("predicted_start"), now_s),
            escape(j.get("owner", "-")),
            escape(j.get("name", "-")),
            f"[dim]{escape(j['state_reason'])}[/]" if j.get("state_reason") else "-",
        )
    total = body.get("total", len(jobs))
    if not jobs:
        table.caption = "no job of yours is waiting" if total else "no job is waiting"
    elif approximate:
        table.caption = "order: priority, then submission time (this server has no /v1/queue)"
    elif total > len(jobs):
        table.caption = f"{len(jobs)} of {total} waiting jobs; the others are not yours"
    console().print(table)
    return 0


def count_text(n: float) -> str:
    """A parameter count in the largest unit it reaches: 8.030B, 1.2M, 821.5K, 96 (the tiny
    presets' 0.8 M parameters printed as 0.001B told nothing apart)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3f}B" if unit == "B" else f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def bytes_text(n_bytes: float) -> str:
    """Bytes in the largest binary unit they reach: 59.8 GiB, 12.3 MiB, 4.0 KiB, 512 B."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= size:
            return f"{n_bytes / size:.1f} {unit}"
    return f"{n_bytes:.0f} B"


def presets(body: dict[str, Any]) -> None:
    """GET /v1/presets as a table: dims, experts, parameters total/active, bf16 state."""
    print(
        f"{'preset':<16} {'architecture':<20} {'L':>3} {'d':>5} {'experts':>8} "
        f"{'params':>9} {'active':>9} {'bf16 state':>11}"
    )
    for p in body["presets"]:
        experts = f"{p['experts_per_token']}/{p['experts']}" if p["experts"] else "-"
        print(
            f"{p['name']:<16} {p['architecture']:<20} {p['layers']:>3} "
            f"{p['hidden_size']:>5} {experts:>8} {count_text(p['params_total']):>9} "
            f"{count_text(p['params_active']):>9} "
            f"{bytes_text(p['training_state_bytes']['bf16']):>11}"
        )


def range_points(plan: dict[str, Any]) -> None:
    """A ranged budget's points from POST /v1/plans (Plan.range_points): the budgets, the
    runtime and predicted tokens/s at each, or why it has no plan: what memory buys."""
    points: list[dict[str, Any]] = plan.get("range_points") or []
    if not points:
        return
    print(f"\n{'device GiB':>10} {'host GiB':>9} {'runtime':<12} {'tokens/s':>10}  note")
    for p in points:
        planned = p["device_gib"] == plan.get("device_gib") and p["host_gib"] == plan.get(
            "host_gib"
        )
        tok_s = p.get("tokens_per_s")
        speed = "-" if tok_s is None else f"{tok_s:,.0f}"
        note = p.get("refused") or ("the plan above" if planned else "")
        print(
            f"{p['device_gib']:>10g} {p['host_gib']:>9g} {p.get('runtime') or '-':<12} "
            f"{speed:>10}  {note}"
        )
