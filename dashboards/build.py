"""The Grafana dashboards, written with Grafana's own typed SDK (grafana-foundation-sdk, whose
models are generated from Grafana's dashboard schema), rendered to the JSON files Grafana
provisions from deploy/grafana/:

- queue.json (uid wstrain-queue, the home): the queue, its waits, every job (a table linking
  to the job board), nodes, the API and Redis;
- job.json (uid wstrain-job, variable `job`): one job's state, training figures, stalls,
  transfers, memory against its budgets, its GPU and its host;
- overview.json (uid wstrain-overview): every node's budgets, GPUs and host, every job's
  throughput and MFU.

    python dashboards/build.py           # rewrites the three JSON files
    python dashboards/build.py --check   # exit 1 if the committed JSON is stale

Every query names the datasource uid that deploy/grafana/provisioning/datasources provisions
and a series of contracts/metrics.py (or node-exporter's); tests/observability
evaluates every query against a real Prometheus scraping a real wstrain on CPU. Panels that
cannot have data there start their description with GPU_ONLY or NEEDS_PEAK, and that test
checks that exactly those come back empty.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders import (
    dashboard,
    prometheus,
    stat,
    table,
    text,
    timeseries,
)
from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement, StackingMode
from grafana_foundation_sdk.models.dashboard import (
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat
from grafana_foundation_sdk.models.text import TextMode

HERE = Path(__file__).resolve().parent
DATASOURCE = DataSourceRef(type_val="prometheus", uid="wstrain-prometheus")
JOB = 'job="$job"'
RATE = "$__rate_interval"

# The first sentence of the description of a panel that has no data on a CPU machine; the
# live test (tests/observability/test_prometheus.py) reads them from here.
GPU_ONLY = "GPU only: NVML's series, none on a CPU node."
NEEDS_PEAK = (
    "Needs the job's peak FLOP/s: a GPU's from the chip table, none on a CPU job unless the "
    "agent is given WSTRAIN_CPU_PEAK_FLOPS."
)
MARKERS = (GPU_ONLY, NEEDS_PEAK)

Query = tuple[str, str]  # (PromQL, legend)
AnyPanel = timeseries.Panel | stat.Panel | table.Panel | text.Panel


# ------------------------------------------------------------------------------ PromQL


def rate(metric: str, selector: str = JOB) -> str:
    """The per-second rate of a job counter, only while the job runs: a rate's window still
    holds an ended job's last samples for up to $__rate_interval (40 s at a 10 s scrape),
    and the live counter, gone from the first scrape after the job ends, masks them."""
    series = f"{metric}{{{selector}}}" if selector else metric
    return f"(rate({series}[{RATE}]) and {series})"


def mfu(selector: str) -> str:
    """Model FLOP/s over the job's peak (absent without a peak, so absent on CPU jobs)."""
    peak = (
        f"wstrain_job_peak_flops_per_second{{{selector}}}"
        if selector
        else "wstrain_job_peak_flops_per_second"
    )
    return (
        f"{rate('wstrain_job_model_flops_total', selector)} / on(job) group_left "
        f"max by (job) ({peak})"
    )


def of_job_gpu(metric: str) -> str:
    """`metric`'s series of the GPU the job holds. wstrain_job_info and the NVML series both
    carry (node, gpu), NVML's index in PCI bus order (agent/gpus.py); their `job`
    labels differ (the wstrain job id; job="wstrain-agent"), so the match names only those."""
    return f"{metric} and on(node, gpu) wstrain_job_info{{{JOB}}}"


# The host of the job's node. node-exporter carries no wstrain node name, so the scrape
# config gives a host's agent and node-exporter targets one `host` label
# (deploy/prometheus/prometheus.yml), and the agent's node series tie that host to the job.
JOB_HOST = f"max by (host) (wstrain_node_slots and on(node) wstrain_job_info{{{JOB}}})"


def on_job_host(expr: str) -> str:
    return f"{expr} and on(host) {JOB_HOST}"


CPU_BUSY = f'1 - avg by (instance, host) (rate(node_cpu_seconds_total{{mode="idle"}}[{RATE}]))'
CPU_PRESSURE = f"rate(node_pressure_cpu_waiting_seconds_total[{RATE}])"
MEMORY_USED = "1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes"
MEMORY_WAITING = f"rate(node_pressure_memory_waiting_seconds_total[{RATE}])"
MEMORY_STALLED = f"rate(node_pressure_memory_stalled_seconds_total[{RATE}])"
PSI = (
    "Pressure (PSI, the kernel's /proc/pressure): the fraction of wall time in which at "
    "least one task waited for the resource (some) or every task stalled on it (full)."
)

# ------------------------------------------------------------------------------ panels


def _query(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    )


def _describe(description: str, needs: str | None) -> str:
    return f"{needs} {description}".strip() if needs else description


def series(
    title: str,
    unit: str,
    queries: list[Query],
    *,
    stacked: bool = False,
    description: str = "",
    needs: str | None = None,
) -> timeseries.Panel:
    """A time-series panel; `needs`: GPU_ONLY or NEEDS_PEAK where a CPU node has no data."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(_describe(description, needs))
        .unit(unit)
        .datasource(DATASOURCE)
        .height(8)
        .span(12)
        .legend(
            VizLegendOptions()
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
        )
    )
    if stacked:
        panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(40)
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + i)))
    return panel


def single(
    title: str,
    unit: str,
    queries: list[Query],
    *,
    description: str = "",
    needs: str | None = None,
    up_down: bool = False,
) -> stat.Panel:
    """A stat panel; `needs` as for series(); `up_down` shows 1/0 as a green up / red down."""
    panel = (
        stat.Panel()
        .title(title)
        .description(_describe(description, needs))
        .unit(unit)
        .datasource(DATASOURCE)
        .height(4)
        .span(6)
    )
    if up_down:
        panel = panel.mappings(
            [
                ValueMap(
                    {
                        "0": ValueMappingResult(text="down", color="red"),
                        "1": ValueMappingResult(text="up", color="green"),
                    }
                )
            ]
        ).thresholds(
            dashboard.ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(None, "red"), Threshold(1, "green")])
        )
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + i)))
    return panel


def job_table(title: str, expr: str, description: str, *, height: int) -> table.Panel:
    """An instant table of job_info joined with job_state, one row a job; its `job` cell
    opens the job board on that job over the same time range."""
    columns = ["job", "name", "owner", "state", "model", "runtime", "node", "gpu"]
    return (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .height(height)
        .span(24)
        .with_target(
            _query(expr, "", "A").instant().format(PromQueryFormat.TABLE),
        )
        .with_transformation(
            DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {
                        "Time": True,
                        "Value": True,
                        "__name__": True,
                        "instance": True,
                    },
                    "indexByName": {name: i for i, name in enumerate(columns)},
                },
            )
        )
        .override_by_name(
            "job",
            [
                DynamicConfigValue(
                    id_val="links",
                    value=[
                        {
                            "title": "Open the job's dashboard",
                            "url": "/d/wstrain-job/wstrain-job?var-job=${__value.raw}"
                            "&${__url_time_range}",
                        }
                    ],
                )
            ],
        )
    )


def note(title: str, content: str) -> text.Panel:
    return text.Panel().title(title).mode(TextMode.MARKDOWN).content(content).height(4).span(12)


def board(title: str, uid: str) -> dashboard.Dashboard:
    """A dashboard with the others one click away (the `wstrain` tag)."""
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .tags(["wstrain"])
        .refresh("10s")
        .time("now-1h", "now")
        .link(
            dashboard.DashboardLink("wstrain")
            .type(DashboardLinkType.DASHBOARDS)
            .tags(["wstrain"])
            .as_dropdown(False)
            .keep_time(True)
        )
    )


def add(board: dashboard.Dashboard, panels: list[AnyPanel]) -> dashboard.Dashboard:
    for panel in panels:
        board = board.with_panel(panel)
    return board


# ------------------------------------------------------------------------------ boards


def queue() -> dashboard.Dashboard:
    # Claims are minutes apart in a lab queue, so a wait quantile over $__rate_interval (4
    # scrapes, 40 s) would be empty most of the time: an hour of claims per point.
    wait_q = [
        (
            f"histogram_quantile({q}, sum by (le) (rate(wstrain_queue_wait_seconds_bucket[1h])))",
            f"p{round(q * 100)}",
        )
        for q in (0.5, 0.95, 0.99)
    ]
    return add(
        board("wstrain: queue", "wstrain-queue"),
        [
            single("Queued jobs", "short", [("wstrain_queue_depth", "")]),
            single("Running jobs", "short", [('sum(wstrain_jobs{state="running"})', "")]),
            single(
                "Oldest queued job waiting",
                "s",
                [("wstrain_queue_oldest_wait_seconds", "")],
                description="Since it was last queued; 0 with an empty queue.",
            ),
            single(
                "Redis and exporter",
                "short",
                [
                    ("min(wstrain_redis_up)", "Redis up"),
                    ("sum(wstrain_exporter_leader)", "exporter"),
                ],
                description="Redis up: 1 when every API replica's last Redis command "
                "succeeded. Exporter: API replicas exporting the store-wide series (1 expected; "
                "0 leaves this board without jobs).",
            ),
            series(
                "Jobs by state",
                "short",
                [("sum by (state) (wstrain_jobs)", "{{state}}")],
                stacked=True,
            ),
            series(
                "Pending jobs by owner",
                "short",
                [("sum by (owner) (wstrain_queue_pending_jobs)", "{{owner}}")],
                stacked=True,
                description="Queued jobs by owner; the total is the queue depth.",
            ),
            series(
                "Queue wait",
                "s",
                [*wait_q, ("wstrain_queue_oldest_wait_seconds", "oldest still queued")],
                description="Quantiles of the wait of the jobs claimed in the trailing hour "
                "(queued to claimed, counted in Redis at the claim), and how long the oldest "
                "queued job has waited so far.",
            ),
            series("Queue depth", "short", [("wstrain_queue_depth", "queued")]),
            job_table(
                "Jobs",
                "wstrain_job_info * on(job) group_left(state) (wstrain_job_state == 1)",
                "Every job live or ended in the last day. Click a job id for its dashboard.",
                height=10,
            ),
            single(
                "Nodes",
                "short",
                [("wstrain_node_up", "{{node}}")],
                description="Down: the agent's heartbeat expired without a clean shutdown.",
                up_down=True,
            ),
            single(
                "API latency p95",
                "s",
                [
                    (
                        "histogram_quantile(0.95, sum by (le) "
                        f"(rate(wstrain_api_request_duration_seconds_bucket[{RATE}])))",
                        "",
                    )
                ],
            ),
            series(
                "API latency p95 by route",
                "s",
                [
                    (
                        "histogram_quantile(0.95, sum by (le, route) "
                        f"(rate(wstrain_api_request_duration_seconds_bucket[{RATE}])))",
                        "{{route}}",
                    )
                ],
            ),
            note(
                "Fair-share usage",
                "Usage per owner against a fair share arrives with the lab-queue scheduler. "
                "Until then the queue is served in priority order; **Pending jobs by owner** "
                "shows who waits.",
            ),
        ],
    )


def job() -> dashboard.Dashboard:
    variable = (
        dashboard.QueryVariable("job")
        .label("Job")
        .datasource(DATASOURCE)
        # job_info, not a live series: a job that failed before its first step is listed
        .query("label_values(wstrain_job_info, job)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    )
    live = "Only while the job runs: a job's live series leave the moment it ends."
    gpu = [
        series(
            "GPU utilisation",
            "percentunit",
            [(of_job_gpu("wstrain_gpu_utilization_ratio"), "gpu {{gpu}}")],
            description="Fraction of NVML's sample period in which a kernel ran, every "
            "process on the GPU.",
            needs=GPU_ONLY,
        ),
        series(
            "GPU memory",
            "bytes",
            [
                (of_job_gpu("wstrain_gpu_memory_used_bytes"), "used"),
                (of_job_gpu("wstrain_gpu_memory_total_bytes"), "total"),
            ],
            description="Every process on the GPU, as NVML counts it.",
            needs=GPU_ONLY,
        ),
        series(
            "GPU power",
            "watt",
            [(of_job_gpu("wstrain_gpu_power_watts"), "gpu {{gpu}}")],
            needs=GPU_ONLY,
        ),
        series(
            "GPU temperature",
            "celsius",
            [(of_job_gpu("wstrain_gpu_temperature_celsius"), "gpu {{gpu}}")],
            needs=GPU_ONLY,
        ),
        series(
            "GPU PCIe throughput",
            "Bps",
            [(of_job_gpu("wstrain_gpu_pcie_throughput_bytes_per_second"), "{{direction}}")],
            description="tx: device to host, rx: host to device; NVML samples 20 ms.",
            needs=GPU_ONLY,
        ),
    ]
    return add(
        board("wstrain: job", "wstrain-job").with_variable(variable),
        [
            job_table(
                "Job",
                f"wstrain_job_info{{{JOB}}} * on(job) group_left(state) "
                f"(wstrain_job_state{{{JOB}}} == 1)",
                "Owner, name, model, runtime, node and GPU (empty until placed), and state.",
                height=4,
            ),
            single(
                "Seconds since last progress",
                "s",
                [(f"time() - wstrain_job_last_progress_timestamp_seconds{{{JOB}}}", "")],
                description="Since the worker's last report (start, step, evaluation, "
                f"checkpoint). {live}",
            ),
            single(
                "Steps done",
                "short",
                [(f"wstrain_job_steps_total{{{JOB}}}", "")],
                description=live,
            ),
            single(
                "Tokens trained",
                "short",
                [(f"wstrain_job_tokens_total{{{JOB}}}", "")],
                description=live,
            ),
            single(
                "MFU now",
                "percentunit",
                [(mfu(JOB), "")],
                description="Model FLOP/s over the peak of the job's chip and precision.",
                needs=NEEDS_PEAK,
            ),
            series(
                "Loss",
                "short",
                [
                    (f"wstrain_job_loss{{{JOB}}}", "training"),
                    (f"wstrain_job_eval_loss{{{JOB}}}", "held-out"),
                ],
            ),
            series(
                "Tokens per second",
                "short",
                [(rate("wstrain_job_tokens_total"), "tokens/s")],
                description=live,
            ),
            series(
                "MFU",
                "percentunit",
                [(mfu(JOB), "{{precision}} MFU")],
                description="Model FLOP/s (tokens x (6 x active parameters + attention)) "
                "over the dense peak of the job's chip for its precision.",
                needs=NEEDS_PEAK,
            ),
            series(
                "Model FLOP/s",
                "short",
                [(rate("wstrain_job_model_flops_total"), "model FLOP/s")],
                description="The numerator of MFU; shown on CPU jobs too.",
            ),
            series(
                "Step time: measured vs predicted",
                "s",
                [
                    (f"wstrain_job_step_seconds{{{JOB}}}", "measured"),
                    (f"wstrain_job_plan_predicted_step_seconds{{{JOB}}}", "predicted"),
                ],
            ),
            series(
                "Steps per second",
                "short",
                [(rate("wstrain_job_steps_total"), "steps/s")],
            ),
            series(
                "Stalls by reason",
                "percentunit",
                [(rate("wstrain_job_stall_seconds_total"), "{{reason}}")],
                stacked=True,
                description="Seconds per second the compute stream waited, by what it waited "
                "for; the stack is the stalled fraction of wall time.",
            ),
            series(
                "Transfer bandwidth vs ceiling",
                "Bps",
                [
                    (rate("wstrain_job_transfer_bytes_total"), "{{direction}}"),
                    (
                        "wstrain_node_transfer_ceiling_bytes_per_second"
                        f" and on(node) wstrain_job_info{{{JOB}}}",
                        "ceiling {{direction}}",
                    ),
                ],
                description="Bytes/s the job copied each way beside its node's measured "
                "ceiling (both: each way while both run).",
            ),
            series(
                "Host memory vs budget",
                "bytes",
                [
                    (f"wstrain_job_host_rss_bytes{{{JOB}}}", "RSS"),
                    (f"wstrain_job_host_pinned_bytes{{{JOB}}}", "pinned"),
                    (f"wstrain_job_host_arena_bytes{{{JOB}}}", "arena"),
                    (f'wstrain_job_budget_bytes{{{JOB},memory="host"}}', "host budget"),
                ],
            ),
            series(
                "Device memory vs budget",
                "bytes",
                [
                    (f"wstrain_job_device_memory_bytes{{{JOB}}}", "{{kind}}"),
                    (f'wstrain_job_budget_bytes{{{JOB},memory="device"}}', "device budget"),
                ],
                description="Peaks of torch's allocator (allocated, reserved); on a CPU job "
                "the worker's peak resident set (process_rss).",
            ),
            *gpu,
            series(
                "Host CPU",
                "percentunit",
                [
                    (on_job_host(CPU_BUSY), "busy"),
                    (on_job_host(CPU_PRESSURE), "pressure (some)"),
                ],
                description=f"The job's host, from node-exporter: busy fraction of all its "
                f"CPUs. {PSI}",
            ),
            series(
                "Host memory",
                "percentunit",
                [
                    (on_job_host(MEMORY_USED), "used"),
                    (on_job_host(MEMORY_WAITING), "pressure (some)"),
                    (on_job_host(MEMORY_STALLED), "pressure (full)"),
                ],
                description="The job's host, from node-exporter: memory in use (not "
                f"available) of all its memory. {PSI}",
            ),
        ],
    )


def overview() -> dashboard.Dashboard:
    who = "* on(job) group_left(owner, name) wstrain_job_info"
    every = "{{node}} gpu {{gpu}}"
    return add(
        board("wstrain: overview", "wstrain-overview"),
        [
            single("Nodes up", "short", [("sum(wstrain_node_up)", "")]),
            single("Running jobs", "short", [('sum(wstrain_jobs{state="running"})', "")]),
            single("Queued jobs", "short", [("wstrain_queue_depth", "")]),
            single(
                "Training throughput",
                "short",
                [(f"sum({rate('wstrain_job_tokens_total', '')})", "")],
                description="Tokens per second, all running jobs.",
            ),
            series(
                "Jobs per node",
                "short",
                [
                    ("wstrain_node_running_jobs", "{{node}} running"),
                    ("wstrain_node_slots", "{{node}} slots"),
                ],
            ),
            series(
                "Free device budget",
                "bytes",
                [
                    ("wstrain_device_free_budget_bytes", "{{node}} {{device}} free"),
                    ("wstrain_device_capacity_bytes", "{{node}} {{device}} total"),
                ],
                description="Device memory a new job could still be given, per device (on a "
                "CPU node: host memory).",
            ),
            series(
                "Free host budget",
                "bytes",
                [
                    ("wstrain_host_free_budget_bytes", "{{node}} free"),
                    ("wstrain_host_capacity_bytes", "{{node}} total"),
                ],
                description="Host memory not reserved by running jobs' budgets.",
            ),
            series(
                "Throughput per job",
                "short",
                [
                    (
                        f"sum by (job) ({rate('wstrain_job_tokens_total', '')}) {who}",
                        "{{owner}}/{{name}}",
                    )
                ],
                description="Tokens per second.",
            ),
            series(
                "MFU per job",
                "percentunit",
                [(f"({mfu('')}) {who}", "{{owner}}/{{name}}")],
                needs=NEEDS_PEAK,
            ),
            series(
                "GPU utilisation",
                "percentunit",
                [("wstrain_gpu_utilization_ratio", every)],
                needs=GPU_ONLY,
            ),
            series(
                "GPU memory used",
                "bytes",
                [
                    ("wstrain_gpu_memory_used_bytes", f"{every} used"),
                    ("wstrain_gpu_memory_total_bytes", f"{every} total"),
                ],
                needs=GPU_ONLY,
            ),
            series("GPU power", "watt", [("wstrain_gpu_power_watts", every)], needs=GPU_ONLY),
            series(
                "GPU temperature",
                "celsius",
                [("wstrain_gpu_temperature_celsius", every)],
                needs=GPU_ONLY,
            ),
            series(
                "Host CPU",
                "percentunit",
                [
                    (CPU_BUSY, "{{instance}} busy"),
                    (CPU_PRESSURE, "{{instance}} pressure (some)"),
                ],
                description=f"Every host's node-exporter: busy fraction of all CPUs. {PSI}",
            ),
            series(
                "Host memory",
                "percentunit",
                [
                    (MEMORY_USED, "{{instance}} used"),
                    (MEMORY_WAITING, "{{instance}} pressure (some)"),
                    (MEMORY_STALLED, "{{instance}} pressure (full)"),
                ],
                description=f"Every host's node-exporter: memory in use. {PSI}",
            ),
        ],
    )


# ------------------------------------------------------------------------------ files


def render(board: dashboard.Dashboard) -> str:
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


DASHBOARDS: dict[str, Callable[[], dashboard.Dashboard]] = {
    "queue.json": queue,
    "job.json": job,
    "overview.json": overview,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is stale")
    args = parser.parse_args()
    stale = []
    for name, make in DASHBOARDS.items():
        text_, path = render(make()), HERE / name
        if args.check:
            if not path.exists() or path.read_text() != text_:
                stale.append(name)
        else:
            path.write_text(text_)
    if stale:
        sys.stderr.write(f"stale dashboards: {stale}; run python dashboards/build.py\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
