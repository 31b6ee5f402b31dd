"""The Grafana dashboards, written with Grafana's own typed SDK (grafana-foundation-sdk, whose
models are generated from Grafana's dashboard schema), rendered to the JSON files Grafana
provisions from deploy/grafana/.

    python dashboards/build.py           # rewrites dashboards/overview.json and job.json
    python dashboards/build.py --check   # exit 1 if the committed JSON is stale

Every query names the datasource uid that deploy/grafana/provisioning/datasources provisions;
tests/observability evaluates every query against a real Prometheus scraping a real wstrain.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement, StackingMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

HERE = Path(__file__).resolve().parent
DATASOURCE = DataSourceRef(type_val="prometheus", uid="wstrain-prometheus")
JOB = 'job="$job"'


def _query(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    )


def series(
    title: str,
    unit: str,
    queries: list[tuple[str, str]],
    *,
    stacked: bool = False,
    description: str = "",
) -> timeseries.Panel:
    """A time-series panel; queries are (PromQL, legend) pairs."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
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


def single(title: str, unit: str, expr: str) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(4)
        .span(6)
        .with_target(_query(expr, "", "A"))
    )


def overview() -> dashboard.Dashboard:
    return (
        dashboard.Dashboard("wstrain: overview")
        .uid("wstrain-overview")
        .tags(["wstrain"])
        .refresh("10s")
        .time("now-1h", "now")
        .with_panel(single("Queued jobs", "short", "wstrain_queue_depth"))
        .with_panel(single("Running jobs", "short", 'sum(wstrain_jobs{state="running"})'))
        .with_panel(single("Nodes", "short", "wstrain_nodes"))
        .with_panel(single("Training throughput", "short", "sum(wstrain_tokens_per_second)"))
        .with_panel(
            series(
                "Jobs by state",
                "short",
                [("sum by (state) (wstrain_jobs)", "{{state}}")],
                stacked=True,
            )
        )
        .with_panel(series("Queue depth", "short", [("wstrain_queue_depth", "queued")]))
        .with_panel(
            series(
                "Free device budget",
                "bytes",
                [
                    ("wstrain_device_free_budget_bytes", "{{node}} {{device}} free"),
                    ("wstrain_device_capacity_bytes", "{{node}} {{device}} total"),
                ],
                description="Device memory a new job could still be given, per GPU.",
            )
        )
        .with_panel(
            series(
                "Free host budget",
                "bytes",
                [
                    ("wstrain_host_free_budget_bytes", "{{node}} free"),
                    ("wstrain_host_capacity_bytes", "{{node}} total"),
                ],
            )
        )
        .with_panel(
            series(
                "Throughput per job",
                "short",
                [("wstrain_tokens_per_second", "{{job}}")],
                description="Tokens per second.",
            )
        )
        .with_panel(series("MFU per job", "percentunit", [("wstrain_mfu_ratio", "{{job}}")]))
        .with_panel(
            series(
                "API latency p95",
                "s",
                [
                    (
                        "histogram_quantile(0.95, sum by (le, route) "
                        "(rate(wstrain_api_request_duration_seconds_bucket[$__rate_interval])))",
                        "{{route}}",
                    )
                ],
            )
        )
        .with_panel(
            series(
                "Jobs per node",
                "short",
                [
                    ("wstrain_node_running_jobs", "{{node}} running"),
                    ("wstrain_node_slots", "{{node}} slots"),
                ],
            )
        )
    )


def job() -> dashboard.Dashboard:
    variable = (
        dashboard.QueryVariable("job")
        .label("Job")
        .datasource(DATASOURCE)
        .query("label_values(wstrain_step_seconds, job)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
    )
    return (
        dashboard.Dashboard("wstrain: job")
        .uid("wstrain-job")
        .tags(["wstrain"])
        .refresh("10s")
        .time("now-1h", "now")
        .with_variable(variable)
        .with_panel(
            series(
                "Loss",
                "short",
                [
                    (f"wstrain_loss{{{JOB}}}", "training"),
                    (f"wstrain_eval_loss{{{JOB}}}", "held-out"),
                ],
            )
        )
        .with_panel(
            series(
                "Tokens per second", "short", [(f"wstrain_tokens_per_second{{{JOB}}}", "tokens/s")]
            )
        )
        .with_panel(series("MFU", "percentunit", [(f"wstrain_mfu_ratio{{{JOB}}}", "MFU")]))
        .with_panel(
            series(
                "Step time: predicted vs measured",
                "s",
                [
                    (f"wstrain_step_seconds{{{JOB}}}", "measured"),
                    (f"wstrain_plan_predicted_step_seconds{{{JOB}}}", "predicted"),
                ],
            )
        )
        .with_panel(
            series(
                "Stall breakdown",
                "percentunit",
                [
                    (
                        f"rate(wstrain_stall_seconds_total{{{JOB}}}[$__rate_interval])",
                        "{{dependency}}",
                    )
                ],
                stacked=True,
                description="Fraction of wall time the compute stream waited, by dependency.",
            )
        )
        .with_panel(
            series(
                "Transfer bandwidth vs ceiling",
                "Bps",
                [
                    (f"wstrain_transfer_bandwidth_bytes_per_second{{{JOB}}}", "{{direction}}"),
                    (
                        "wstrain_node_transfer_ceiling_bytes_per_second"
                        f" and on (instance) wstrain_step_seconds{{{JOB}}}",
                        "ceiling {{direction}}",
                    ),
                ],
                description="Achieved bytes/s per direction beside this host's measured ceiling.",
            )
        )
        .with_panel(
            series(
                "Host memory vs budget",
                "bytes",
                [
                    (f"wstrain_host_rss_bytes{{{JOB}}}", "RSS"),
                    (f"wstrain_host_pinned_bytes{{{JOB}}}", "pinned"),
                    (f"wstrain_host_arena_bytes{{{JOB}}}", "arena"),
                    (f'wstrain_budget_bytes{{{JOB},memory="host"}}', "host budget"),
                ],
            )
        )
        .with_panel(
            series(
                "Device memory vs budget",
                "bytes",
                [
                    (f"wstrain_device_memory_bytes{{{JOB}}}", "{{kind}}"),
                    (f'wstrain_budget_bytes{{{JOB},memory="device"}}', "device budget"),
                ],
            )
        )
        .with_panel(
            series(
                "Bytes moved",
                "Bps",
                [
                    (
                        f"rate(wstrain_transfer_bytes_total{{{JOB}}}[$__rate_interval])",
                        "{{direction}}",
                    )
                ],
            )
        )
        .with_panel(series("Progress", "short", [(f"wstrain_job_step{{{JOB}}}", "step")]))
    )


def render(board: dashboard.Dashboard) -> str:
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


DASHBOARDS = {"overview.json": overview, "job.json": job}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a file is stale")
    args = parser.parse_args()
    stale = []
    for name, make in DASHBOARDS.items():
        text, path = render(make()), HERE / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        sys.stderr.write(f"stale dashboards: {stale}; run python dashboards/build.py\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
