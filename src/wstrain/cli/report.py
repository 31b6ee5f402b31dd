"""`wstrain report ID`: one self-contained HTML page of a job's training, drawn from the job's
own event log through the API, so it needs no Prometheus.

    wstrain report ID [-o report-ID.html]      # then open the file in any browser

The page is a summary table and PNG plots (matplotlib's Agg canvas, inlined as base64 data:
URIs, no JavaScript, no other files): loss and held-out loss, tokens/s, MFU (when the worker
knows its chip's peak), stall seconds by reason, host<->device bandwidth, and host and device
memory against the job's budgets. It is rendered here in the CLI process, never in the API.
Every string that comes from the job goes through html.escape: names and owners are user input.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from wstrain.contracts.calibration import GIB
from wstrain.contracts.metrics import STALL_REASONS, TRANSFER_DIRECTIONS

# GET a path with query parameters from the API, returning the decoded JSON (the CLI's _call)
Getter = Callable[[str, dict[str, Any]], Any]

EVENTS_PAGE = 1000  # the largest page GET /v1/jobs/{id}/events serves (limit le=1000)
EVENT_LOG_CAP = 10_000  # store/lua.py: XADD MAXLEN ~ 10000 keeps about the newest 10,000
GB = 1e9  # bandwidth in decimal GB/s, as PCIe and NVLink links are quoted
# 9 x 3 in at 100 dpi: 900 x 300 px, ~40 KB a plot, legible on a laptop screen
FIGURE_IN = (9.0, 3.0)
FIGURE_DPI = 100
HOST_KINDS = ("host_rss_bytes", "host_arena_bytes", "host_pinned_bytes")
MEMORY_LABELS = {
    "host_rss_bytes": "worker RSS",
    "host_arena_bytes": "arena (accounted host buffers)",
    "host_pinned_bytes": "pinned (page-locked)",
    "device_memory_bytes.allocated": "allocated (torch peak)",
    "device_memory_bytes.reserved": "reserved (torch peak)",
    "device_memory_bytes.process_rss": "process peak RSS (CPU job: the device is the host)",
}
MARKED_POINTS = 60  # a line of up to 60 reports shows each one as a dot
STALLS = "Stalls: seconds per step the compute stream waited, by reason"
TRANSFERS = "Host <-> device transfer bandwidth"
WAYS = {"h2d": "host to device", "d2h": "device to host"}
# the worker's device-memory keys, and the older spelling still in long-lived event logs
DEVICE_PREFIX, OLD_DEVICE_PREFIX = "device_memory_bytes.", "device_memory.peak_"


@dataclass(frozen=True)
class Baseline:
    """Where a worker's cumulative counters stood: at its start (all 0) or its last report."""

    step: int
    ts: float
    metrics: dict[str, float]


@dataclass(frozen=True)
class Progress:
    """One `progress` event: a worker's report of a step."""

    step: int
    ts: float
    data: dict[str, Any]  # the worker's step message: loss, tokens_per_s, mfu, ...
    metrics: dict[str, float]  # its telemetry, device-memory keys in the current spelling
    prev: Baseline | None  # same worker's previous report; None where the log lost it
    attempt: int  # counters restart with each worker process (each `started` event)


@dataclass
class History:
    """What the page plots, from the event log."""

    progress: list[Progress] = field(default_factory=list)
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out loss)
    trimmed: bool = False  # the job's submission event is gone: the stream was capped


def fetch(get: Getter, job_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job (with its plan) and every event it still has, oldest first, page by page."""
    path = f"/v1/jobs/{quote(job_id, safe='')}"
    job: dict[str, Any] = get(path, {})
    if job.get("plan") is None:
        job["plan"] = get(f"{path}/plan", {})
    events: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": EVENTS_PAGE}
    while page := get(f"{path}/events", params):
        events.extend(page)
        if len(page) < EVENTS_PAGE:
            break
        params["after"] = page[-1]["id"]
    return job, events


def _current_keys(metrics: dict[str, float]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if key.startswith(OLD_DEVICE_PREFIX):
            key = DEVICE_PREFIX + key.removeprefix(OLD_DEVICE_PREFIX)
        out[key] = float(value)
    return out


def history(events: list[dict[str, Any]]) -> History:
    """The curves in a job's events (oldest first): progress reports, each tied to the same
    worker's previous one, and held-out losses."""
    first = events[0] if events else {}
    # a job's first event is its submission, state `queued`; a capped stream has lost it
    submission = first.get("kind") == "state" and (first.get("data") or {}).get("state") == "queued"
    h = History(trimmed=bool(events) and not submission)
    last: Baseline | None = None
    attempt = 0
    for ev in events:
        data = ev.get("data") or {}
        if ev["kind"] == "started":
            attempt += 1
            last = Baseline(int(data.get("step") or 0), ev["ts"], {})
        elif ev["kind"] == "progress" and data.get("step") is not None:
            metrics = _current_keys(data.get("metrics") or {})
            h.progress.append(Progress(data["step"], ev["ts"], data, metrics, last, attempt))
            last = Baseline(data["step"], ev["ts"], metrics)
        elif ev["kind"] == "eval" and data.get("loss") is not None:
            h.evals.append((int(data["step"]), float(data["loss"])))
    return h


def _delta(p: Progress, key: str, per: Literal["step", "second"]) -> float:
    """Growth of a cumulative counter since the worker's previous report, per step or per
    second; NaN where there is no previous report (a gap in the line)."""
    if p.prev is None or key not in p.metrics:
        return math.nan
    span = p.step - p.prev.step if per == "step" else p.ts - p.prev.ts
    grown = p.metrics[key] - p.prev.metrics.get(key, 0.0)
    return grown / span if span > 0 and grown >= 0 else math.nan


def _total(progress: list[Progress], key: str) -> float:
    """A counter's total over every worker attempt: the last value each attempt reported."""
    last: dict[int, float] = {}
    for p in progress:
        if key in p.metrics:
            last[p.attempt] = p.metrics[key]
    return sum(last.values())


def _series(progress: list[Progress], get: Callable[[Progress], Any]) -> list[float]:
    return [math.nan if (v := get(p)) is None else float(v) for p in progress]


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    FigureCanvasAgg(fig)  # Agg, whatever backend pyplot would pick: no display needed
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _axes(ylabel: str) -> tuple[Figure, Any]:
    """A figure with one axes over steps; its title is the section's heading on the page."""
    fig = Figure(figsize=FIGURE_IN, dpi=FIGURE_DPI, layout="constrained")
    ax = fig.subplots()
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _line(ax: Any, steps: list[int], ys: list[float], label: str | None = None) -> None:
    ax.plot(steps, ys, marker="." if len(steps) <= MARKED_POINTS else None, label=label)


@dataclass(frozen=True)
class Section:
    title: str
    png_b64: str | None  # None: `note` says why there is no plot
    note: str = ""


def _keys(progress: list[Progress], prefix: str) -> list[str]:
    return sorted({k for p in progress for k in p.metrics if k.startswith(prefix)})


def _budget_point(job: dict[str, Any]) -> dict[str, float]:
    """The budgets the job runs at in GiB: its plan's point (a ranged budget's), else the
    spec's chosen point or numbers."""
    plan, budget = job.get("plan") or {}, job["spec"]["budget"]
    if plan.get("device_gib") is not None and plan.get("host_gib") is not None:
        return {"device_gib": plan["device_gib"], "host_gib": plan["host_gib"]}
    chosen: dict[str, float] = budget.get("chosen") or {}
    point: dict[str, float] = {}
    for key in ("device_gib", "host_gib"):
        sent = budget[key]
        value = chosen[key] if key in chosen else sent["max"] if isinstance(sent, dict) else sent
        point[key] = float(value)
    return point


def plots(h: History, job: dict[str, Any]) -> list[Section]:
    """Every section of the page below the summary, in order: a plot, or a line saying why not."""
    pr, budget = h.progress, _budget_point(job)
    device = (job.get("plan") or {}).get("device", "cpu")
    return [
        _loss(h),
        _throughput(pr),
        _mfu(pr, device),
        _stalls(pr),
        _transfers(pr),
        _memory(pr, "Host memory against the host budget", HOST_KINDS, budget["host_gib"], "host"),
        _memory(
            pr,
            "Device memory (peaks) against the device budget",
            _keys(pr, DEVICE_PREFIX),
            budget["device_gib"],
            "device",
        ),
    ]


def _loss(h: History) -> Section:
    fig, ax = _axes("loss")
    _line(ax, _steps(h.progress), _series(h.progress, lambda p: p.data.get("loss")), "training")
    if h.evals:
        ax.plot(*zip(*h.evals, strict=True), "o-", label="held-out (eval events)")
    ax.legend()
    return Section("Loss: training, and held-out where the job evaluates", _png(fig))


def _throughput(pr: list[Progress]) -> Section:
    fig, ax = _axes("tokens/s")
    _line(ax, _steps(pr), _series(pr, lambda p: p.data.get("tokens_per_s")))
    return Section("Throughput: tokens trained per second", _png(fig))


def _mfu(pr: list[Progress], device: str) -> Section:
    if not any(p.data.get("mfu") is not None for p in pr):
        why = "CPU job (no peak FLOP/s)" if device == "cpu" else "the progress events carry none"
        return Section("MFU", None, f"no MFU: {why}")
    fig, ax = _axes("MFU (%)")
    _line(ax, _steps(pr), [100 * v for v in _series(pr, lambda p: p.data.get("mfu"))])
    return Section("MFU: model FLOP/s over the chip's dense peak", _png(fig))


def _stalls(pr: list[Progress]) -> Section:
    reasons = _keys(pr, "stall_seconds_total.")
    if not reasons:
        return Section(STALLS, None, "no stall counters in the progress events")
    fig, ax = _axes("s / step")
    for key in sorted(reasons, key=lambda k: _order(k, STALL_REASONS)):
        label = f"{key.split('.', 1)[1]} ({_total(pr, key):.3g} s in all)"
        _line(ax, _steps(pr), [_delta(p, key, "step") for p in pr], label)
    ax.legend(fontsize=8)
    return Section(STALLS, _png(fig))


def _transfers(pr: list[Progress]) -> Section:
    directions = _keys(pr, "transfer_bandwidth.") or _keys(pr, "transfer_bytes_total.")
    if not directions:
        return Section(TRANSFERS, None, "no transfer counters in the progress events")
    fig, ax = _axes("GB/s")
    for key in sorted(directions, key=lambda k: _order(k, TRANSFER_DIRECTIONS)):
        way = key.split(".", 1)[1]
        moved_gb = _total(pr, f"transfer_bytes_total.{way}") / GB
        if key.startswith("transfer_bandwidth."):  # the last step's bytes over its seconds
            ys = _metric(pr, key)
        else:  # older logs: the counter's growth between two reports over their seconds
            ys = [_delta(p, key, "second") for p in pr]
        label = f"{way}, {WAYS.get(way, way)} ({moved_gb:.3g} GB in all)"
        _line(ax, _steps(pr), [y / GB for y in ys], label)
    ax.legend(fontsize=8)
    return Section(TRANSFERS, _png(fig))


def _memory(
    pr: list[Progress], title: str, keys: Sequence[str], budget_gib: float, what: str
) -> Section:
    present = [k for k in keys if any(k in p.metrics for p in pr)]
    if not present:
        return Section(title, None, f"no {what} memory telemetry in the progress events")
    fig, ax = _axes("GiB")
    for key in present:
        _line(ax, _steps(pr), [v / GIB for v in _metric(pr, key)], MEMORY_LABELS.get(key, key))
    ax.axhline(budget_gib, color="red", linestyle="--", label=f"{what} budget {budget_gib:g} GiB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return Section(title, _png(fig))


def _steps(pr: list[Progress]) -> list[int]:
    return [p.step for p in pr]


def _order(key: str, known: tuple[str, ...]) -> tuple[int, str]:
    name = key.split(".", 1)[1]
    return (known.index(name) if name in known else len(known), name)


def _metric(pr: list[Progress], key: str) -> list[float]:
    return [p.metrics.get(key, math.nan) for p in pr]


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def summary(job: dict[str, Any], h: History, n_events: int) -> list[tuple[str, str]]:
    plan, budget = job.get("plan") or {}, _budget_point(job)
    first = h.progress[0].step if h.progress else None
    return [
        ("id", job["id"]),
        ("name", job["name"]),
        ("owner", job["owner"]),
        ("state", f"{job['state']} (attempt {job['attempt']})"),
        ("step", f"{job['step']}/{job['steps']}"),
        ("runtime", f"{plan.get('runtime', '-')} on {plan.get('device', '-')}"),
        ("budgets", f"device {budget['device_gib']:g} GiB, host {budget['host_gib']:g} GiB"),
        ("loss", f"{_num(job.get('loss'))} (held-out {_num(job.get('eval_loss'))})"),
        ("tokens/s", "-" if job.get("tokens_per_s") is None else f"{job['tokens_per_s']:,.0f}"),
        ("node", _num(job.get("node"))),
        ("created", _when(job.get("created_at"))),
        ("updated", _when(job.get("updated_at"))),
        ("last checkpoint", _num(job.get("last_checkpoint"))),
        ("error", _num(job.get("error"))),
        (
            "event log",
            f"{n_events} events, {len(h.progress)} progress reports from step "
            f"{_num(first)}, {len(h.evals)} evaluations",
        ),
    ]


def _log_note(h: History) -> str:
    first = h.progress[0].step if h.progress else None
    if h.trimmed:
        return (
            f"The event log starts at step {_num(first)}, not at the job's submission: Redis "
            f"keeps about the newest {EVENT_LOG_CAP:,} events of a job (XADD MAXLEN ~), so "
            "this long job's oldest events are gone and the plots begin there."
        )
    if first is not None and first > 1:
        return f"The event log's first progress report is at step {first}, not step 1."
    return ""


CSS = """body{font:14px/1.4 system-ui,sans-serif;max-width:960px;margin:24px auto;color:#222}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #ddd;
text-align:left;vertical-align:top}th{color:#555;font-weight:600}
.note{background:#fff4d6;border:1px solid #e8c66a;padding:8px 12px}
img{display:block;max-width:100%}h2{font-size:16px;margin:22px 0 4px}"""


def render(job: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """The report page of `job` from its events (oldest first), as one HTML string."""
    h = history(events)
    esc = html.escape
    rows = "\n".join(
        f"<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in summary(job, h, len(events))
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>wstrain report {esc(job['id'])}</title><style>{CSS}</style></head><body>",
        f"<h1>Job {esc(job['id'])}: {esc(job['name'])}</h1>",
        f"<table>{rows}</table>",
    ]
    if note := _log_note(h):
        parts.append(f'<p class="note">{esc(note)}</p>')
    if not h.progress:
        parts.append('<p class="note">No progress events yet: the job has not reported a step.</p>')
    else:
        for s in plots(h, job):
            parts.append(f"<h2>{esc(s.title)}</h2>")
            if s.png_b64 is None:
                parts.append(f"<p>{esc(s.note)}</p>")
            else:
                parts.append(f'<img src="data:image/png;base64,{s.png_b64}" alt="{esc(s.title)}">')
    stamp = datetime.now(tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    parts.append(f"<p><small>wstrain report, written {stamp} from the job's event log.</small></p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
