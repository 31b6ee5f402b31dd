"""The `wstrain` command line.

    wstrain serve [--host 127.0.0.1] [--port 8000] [--state-dir DIR] [--metrics-port 9464]
    wstrain submit SPEC.yaml [--follow] [--sweep KEY=V1,V2 ...] [--gpus N] [--nodes M]
                          [--device-gib 40 | 12:40] [--host-gib 64 | 16:64] [--disk-gib 128]
    wstrain plan SPEC.yaml [--gpus N] [--nodes M] [--gpu h100|h200|a100|...] [--device-gib ..]
    wstrain ls [--state S] [--json]    wstrain status ID [--json]    wstrain queue
    wstrain watch ID     wstrain logs [-f] ID     wstrain cancel ID     wstrain resume ID
    wstrain presets      wstrain report ID [-o report-ID.html]     wstrain prepare IN OUT
    wstrain grant OWNER --max-priority N --max-jobs M    wstrain revoke OWNER    wstrain grants

Client commands talk to the server named by --server, else $WSTRAIN_URL, else `server =`
in the config file ($WSTRAIN_CONFIG or ~/.config/wstrain/config.toml), else
http://127.0.0.1:8000, and send the bearer token found the same way (--token,
$WSTRAIN_TOKEN, `token =`); --server and --token go before or after the subcommand
(cli_client.py). Errors print the server's message and exit 1; a spec file or --sweep that
cannot be used exits 2; Ctrl-C exits 130, but 0 in `watch`, `submit --follow` (the job keeps
running) and `logs -f`.

The commands live beside this module: cli_spec.py (spec files, paths, sweeps), cli_watch.py
(watch, logs), cli_tables.py (ls, status, queue), cli_grants.py (grant, revoke, grants).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from wstrain.cli import grants as cli_grants
from wstrain.cli import tables as cli_tables
from wstrain.cli import watch as cli_watch
from wstrain.cli.client import CliError, call, client, resolve
from wstrain.cli.spec import (
    MAX_SWEEP_POINTS,
    gib_or_range,
    load_spec,
    parse_sweeps,
    submit_sweep,
    sweep_specs,
    usage_error,
    with_budget,
    with_gpus,
    with_nodes,
)
from wstrain.contracts.calibration import GIB
from wstrain.contracts.jobs import JobState

log = logging.getLogger(__name__)

GPUS_HELP = (
    "train on N GPUs of one node, data parallel (sets the spec's `gpus`: 1..8, dividing "
    "global_batch; budget.device_gib is then per GPU)"
)
GPU_HELP = (
    "plan for this chip (h100, h200, a100, l40s, b200, ...; the server lists them) with "
    "the profile wstrain ships for it, not the queue's nodes: a plan from a laptop"
)
NODES_HELP = (
    "train on M nodes, gpus on each (sets the spec's `nodes`: 1..16; gpus x nodes must "
    "divide global_batch; the state dir must be shared by every node)"
)


DEVICE_GIB_HELP = (
    "sets budget.device_gib: GiB per GPU, or a range MIN:MAX (e.g. 12:40) the service "
    "chooses a point of"
)
HOST_GIB_HELP = "sets budget.host_gib: GiB, or a range MIN:MAX (e.g. 16:64)"
DISK_GIB_HELP = (
    "sets budget.disk_gib: GiB of the node's spill directory for AdamW moments the host "
    "budget cannot hold (the disk tier)"
)


def _flag_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The spec file with --gpus, --nodes, --device-gib, --host-gib and --disk-gib applied."""
    spec = with_nodes(with_gpus(load_spec(args.spec), args.gpus), args.nodes)
    return with_budget(spec, args.device_gib, args.host_gib, args.disk_gib)


def _print_plan(plan: dict[str, Any]) -> None:
    pred, ws = plan["predicted"], plan.get("working_set")
    rows = [
        ("runtime", plan["runtime"]),
        ("device", plan["device"]),
        ("micro_batch", plan["micro_batch"]),
        ("rounds", plan["rounds"]),
        *([("ranks", plan["ranks"])] if plan.get("ranks", 1) > 1 else []),
        *([("nodes", plan["nodes"])] if plan.get("nodes", 1) > 1 else []),
        ("window", plan["window"]),
        ("params", f"{plan['params'] / 1e6:.2f} M"),
    ]
    if plan.get("device_gib") is not None:  # the budgets it was planned at (a range's point)
        rows.append(("device/host", f"{plan['device_gib']:g} / {plan['host_gib']:g} GiB"))
    if ws:
        rows += [
            ("rings", f"{ws['r_param']} / {ws['r_grad']}"),
            ("levels", " ".join(str(sum(r.count(lv) for r in ws["levels"])) for lv in range(4))),
            ("optimizer", ws["optimizer"]),
            ("loss_tokens", ws["loss_tokens"]),
        ]
    rows += [
        ("step_seconds", f"{pred['step_seconds']:.4g}"),
        ("peak_device", f"{pred['peak_device_bytes'] / GIB:.3f} GiB"),
        ("peak_host", f"{pred['peak_host_bytes'] / GIB:.3f} GiB"),
    ]
    if "gpu" in plan["reasons"]:  # planned for a chip (--gpu), not the queue's nodes
        print(f"note: {plan['reasons']['gpu']}")
    print(f"{'field':<13} {'value':<14} reason")
    for k, v in rows:
        print(f"{k:<13} {v!s:<14} {plan['reasons'].get(k, '')}")


def _report(client: httpx.Client, job_id: str, out: str | None) -> None:
    from wstrain.cli import report  # matplotlib: only for this command (0.3 s to import)

    job, events = report.fetch(
        lambda path, params: call(client, "GET", path, params=params), job_id
    )
    page = report.render(job, events)
    out = out or f"report-{job['id']}.html"  # the id the API knows, never a path
    try:
        Path(out).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot write the report to {out}: {exc}; pass a writable -o FILE") from exc
    print(
        f"{out}: {len(events)} events of job {job['id']} ({job['state']}, step "
        f"{job['step']}/{job['steps']}); open it in a browser"
    )


def _submit(c: httpx.Client, args: argparse.Namespace) -> int:
    spec = _flag_spec(args)
    if args.sweep:
        if args.follow:
            raise usage_error("--follow watches one job; submit the sweep, then watch its jobs")
        specs = sweep_specs(spec, parse_sweeps(args.sweep))
        ids = submit_sweep(c, specs)
        print("\n".join(ids))
        print(
            f"wstrain: sweep {specs[0]['group']}: {len(ids)} jobs, {specs[0]['name']} to "
            f"{specs[-1]['name']}; `wstrain status ID` or `wstrain watch ID` each",
            file=sys.stderr,
        )
        return 0
    job = call(c, "POST", "/v1/jobs", json=spec)
    print(job["id"], flush=True)
    return cli_watch.watch(c, job["id"]) if args.follow else 0


def _run_client(args: argparse.Namespace) -> int:
    conn = resolve(getattr(args, "server", None), getattr(args, "token", None))
    with client(conn) as c:
        if args.cmd == "submit":
            return _submit(c, args)
        if args.cmd == "watch":
            return cli_watch.watch(c, args.id)
        if args.cmd == "logs":
            return cli_watch.logs(c, args.id, args.follow)
        if args.cmd == "ls":
            return cli_tables.ls(c, args.state, args.owner, args.limit, args.json)
        if args.cmd == "status":
            return cli_tables.status(c, args.id, args.json)
        if args.cmd == "queue":
            return cli_tables.queue(c, args.json)
        if args.cmd in cli_grants.GRANT_COMMANDS:
            return cli_grants.run(c, args)
        if args.cmd == "plan":
            params = {"gpu": args.gpu} if args.gpu else None
            plan = call(c, "POST", "/v1/plans", json=_flag_spec(args), params=params)
            _print_plan(plan)
            cli_tables.range_points(plan)
        elif args.cmd == "presets":
            cli_tables.presets(call(c, "GET", "/v1/presets"))
        elif args.cmd == "report":
            _report(c, args.id, args.out)
        elif args.cmd in ("cancel", "resume"):
            job = call(c, "POST", f"/v1/jobs/{args.id}/{args.cmd}")
            print(f"{job['id']} {job['state']}")
    return 0


def _connection_options() -> argparse.ArgumentParser:
    """--server and --token, on the main parser and every subcommand: SUPPRESS leaves an
    option a parser did not see unset, so `wstrain --server A ls --server B` means B."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("server")
    g.add_argument(
        "--server",
        default=argparse.SUPPRESS,
        help="the API's URL (else $WSTRAIN_URL, the config file's `server`, http://127.0.0.1:8000)",
    )
    g.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help="bearer token (else $WSTRAIN_TOKEN, the config file's `token`); other users "
        "of the host can read a flag in `ps`, prefer the file (chmod 600) or the variable",
    )
    return common


def _page_size(text: str) -> int:
    """--limit: GET /v1/jobs answers at most 500 jobs a page."""
    if not text.isdigit() or not 1 <= int(text) <= 500:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of jobs from 1 to 500")
    return int(text)


SPEC_PATHS_HELP = (
    "relative model.path, data.path and data.tokenizer in the spec are taken from the "
    "spec file's directory and sent as absolute paths"
)


def _budget_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--device-gib",
        type=gib_or_range("--device-gib"),
        metavar="GIB|MIN:MAX",
        help=DEVICE_GIB_HELP,
    )
    s.add_argument(
        "--host-gib", type=gib_or_range("--host-gib"), metavar="GIB|MIN:MAX", help=HOST_GIB_HELP
    )
    s.add_argument("--disk-gib", type=float, metavar="GIB", help=DISK_GIB_HELP)


def build_parser() -> argparse.ArgumentParser:
    common = _connection_options()
    p = argparse.ArgumentParser(
        prog="wstrain",
        description="wstrain training service",
        parents=[common],
        epilog="config file: $WSTRAIN_CONFIG or ~/.config/wstrain/config.toml, TOML with "
        "server = ... and token = ...; a flag wins over the environment, which wins over "
        "the file",
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    def cmd(name: str, help: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common], **kw)

    s = cmd("serve", "run the API, one scheduler agent and (if needed) Redis")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="job dirs, checkpoints, logs and the private Redis (else $WSTRAIN_STATE_DIR, "
        "else ./wstrain-state); the API, the agent and its workers all guard this one",
    )
    s.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("WSTRAIN_METRICS_PORT", "9464")),
        help="port of the agent's /metrics (job series), on --host",
    )
    s = cmd("submit", "submit a job spec (YAML or JSON)")
    s.add_argument("spec", help="the JobSpec file; " + SPEC_PATHS_HELP)
    s.add_argument(
        "--follow",
        action="store_true",
        help="show a live progress bar until the job ends (Ctrl-C detaches; the job runs on)",
    )
    s.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="one job per point of the product of every --sweep (dotted KEY into the spec, "
        f"values read as YAML), named NAME-i, one shared group; at most {MAX_SWEEP_POINTS}",
    )
    s.add_argument("--gpus", type=int, metavar="N", help=GPUS_HELP)
    s.add_argument("--nodes", type=int, metavar="M", help=NODES_HELP)
    _budget_flags(s)
    s = cmd("plan", "show the plan a spec would get")
    s.add_argument("spec", help="the JobSpec file; " + SPEC_PATHS_HELP)
    s.add_argument("--gpus", type=int, metavar="N", help=GPUS_HELP)
    s.add_argument("--nodes", type=int, metavar="M", help=NODES_HELP)
    s.add_argument("--gpu", type=str.lower, metavar="NAME", help=GPU_HELP)
    _budget_flags(s)
    s = cmd("ls", "list jobs, newest first")
    s.add_argument("--state", choices=[st.value for st in JobState])
    s.add_argument("--owner")
    s.add_argument("--limit", type=_page_size, default=50, help="jobs shown, 1..500 (50)")
    s.add_argument("--json", action="store_true", help="the server's JSON")
    s = cmd("status", "show one job")
    s.add_argument("id")
    s.add_argument("--json", action="store_true", help="the server's JSON")
    cmd("queue", "pending jobs in the order they will run, and why each waits").add_argument(
        "--json", action="store_true", help="the server's JSON"
    )
    cmd("watch", "a live progress bar until the job ends (Ctrl-C detaches)").add_argument("id")
    s = cmd("logs", "print a job's worker log")
    s.add_argument("id")
    s.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until the job ends"
    )
    cmd("cancel", "cancel a job (checkpoint, then stop)").add_argument("id")
    cmd("resume", "resume a cancelled/failed job").add_argument("id")
    cmd("presets", "list model presets: sizes, experts, training state")
    cli_grants.add_parsers(cmd)
    s = cmd("report", "write one self-contained HTML page of a job's plots")
    s.add_argument("id")
    s.add_argument("-o", "--out", help="the HTML file to write (default: report-ID.html)")
    s = cmd(
        "prepare",
        "tokenize text/JSONL/Parquet/datasets dir into a token file (all cores, resumable)",
    )
    s.add_argument("input", help="a .txt, .jsonl or .parquet file, or a datasets save_to_disk dir")
    s.add_argument("out", help="the token file to write, NAME.bin (NAME.idx, NAME.json beside)")
    s.add_argument("--tokenizer", default="byte", help='a tokenizer.json, or "byte"')
    s.add_argument("--text-field", default="text", help="JSONL key / Parquet or Arrow column")
    s.add_argument("--workers", type=int, default=0, help="processes (default: every core)")
    s.add_argument("--chunk-mib", type=int, default=16, help="MiB of input per unit of work")
    return p


def _prepare(args: argparse.Namespace) -> int:
    from wstrain.prepare.pipeline import PrepareRequest, prepare  # numpy and tokenizers

    if not 0 <= args.workers <= 4096 or not 1 <= args.chunk_mib <= 4096:
        raise CliError("--workers must be 0..4096 and --chunk-mib 1..4096")
    req = PrepareRequest(
        args.input, args.out, args.tokenizer, args.text_field, args.workers, args.chunk_mib << 20
    )
    try:
        header = prepare(req, progress=sys.stderr.isatty())
    except (ValueError, OSError) as exc:
        raise CliError(f"prepare {args.input}: {exc}") from exc
    print(
        f"{args.out}: {header.tokens} tokens ({header.dtype}), {header.documents} documents; "
        f"train on it with data: {{kind: tokens, path: {args.out}}}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "httpcore"):  # a line per request would drown the output
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.cmd == "serve":
        from wstrain.cli.serve import serve  # uvicorn and process management only when serving

        return serve(args.host, args.port, args.state_dir, args.metrics_port)
    try:
        return _prepare(args) if args.cmd == "prepare" else _run_client(args)
    except CliError as exc:
        print(f"wstrain: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130  # 128 + SIGINT, as a shell reports it
    except BrokenPipeError:  # `wstrain logs ID | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
