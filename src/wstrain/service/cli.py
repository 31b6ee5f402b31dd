"""The `wstrain` command line.

    wstrain serve [--host 127.0.0.1] [--port 8000] [--state-dir DIR] [--metrics-port 9464]
    wstrain submit SPEC.yaml [--follow]     wstrain ls [--state S]     wstrain status ID
    wstrain cancel ID    wstrain resume ID    wstrain plan SPEC.yaml    wstrain presets
    wstrain report ID [-o report-ID.html]   # one HTML page of plots, from the job's events

Client commands talk to --server or $WSTRAIN_URL (default http://127.0.0.1:8000) and send
$WSTRAIN_TOKEN as the bearer token when it is set. Errors print the server's message and
exit 1; a spec file that does not parse exits 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from wstrain.scheduler.contracts.calibration import GIB
from wstrain.scheduler.contracts.jobs import TERMINAL_STATES, JobState

log = logging.getLogger(__name__)


class CliError(Exception):
    pass


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {}
    if token := os.environ.get("WSTRAIN_TOKEN"):
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(base_url=args.server, headers=headers, timeout=30.0)


def _call(client: httpx.Client, method: str, path: str, **kw: Any) -> Any:
    try:
        resp = client.request(method, path, **kw)
    except httpx.HTTPError as exc:
        raise CliError(
            f"cannot reach the wstrain server at {client.base_url}: {exc}; start "
            "it with `wstrain serve` or set --server / WSTRAIN_URL"
        ) from exc
    if resp.status_code >= 400:
        try:
            body = resp.json()
        except ValueError:
            body = {"detail": resp.text}
        detail = body.get("detail", body)
        if isinstance(detail, list):  # pydantic field errors
            detail = "; ".join(
                f"{'.'.join(str(x) for x in e['loc'][1:])}: {e['msg']}" for e in detail
            )
        extra = f" (minimum budget: {body['min_budget']})" if "min_budget" in body else ""
        raise CliError(f"{resp.status_code}: {detail}{extra}")
    return resp.json()


def _spec_error(message: str) -> SystemExit:
    print(f"wstrain: {message}", file=sys.stderr)
    return SystemExit(2)


def _load_spec(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise _spec_error(f"cannot read spec {path}: {exc}") from exc
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _spec_error(f"{path} is not valid YAML/JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise _spec_error(f"{path} must hold a mapping (a JobSpec), not {type(spec).__name__}")
    return spec


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def _print_job(job: dict[str, Any]) -> None:
    rows = [
        ("id", job["id"]),
        ("name", job["name"]),
        ("state", job["state"]),
        ("step", f"{job['step']}/{job['steps']}"),
        ("loss", _fmt(job["loss"])),
        ("eval_loss", _fmt(job.get("eval_loss"))),
        ("epoch", _fmt(job.get("epoch"))),
        ("tokens", _fmt(job.get("tokens_seen"))),
        ("data pos", _fmt(job.get("data_position"))),
        ("tokens/s", _fmt(job["tokens_per_s"])),
        ("mfu", _fmt(job["mfu"])),
        ("eta_s", _fmt(job["eta_s"])),
        ("attempt", job["attempt"]),
        ("node", _fmt(job["node"])),
        ("checkpoint", _fmt(job["last_checkpoint"])),
        ("error", _fmt(job["error"])),
    ]
    for k, v in rows:
        print(f"{k:>11}  {v}")


def _print_plan(plan: dict[str, Any]) -> None:
    pred, ws = plan["predicted"], plan.get("working_set")
    rows = [
        ("runtime", plan["runtime"]),
        ("device", plan["device"]),
        ("micro_batch", plan["micro_batch"]),
        ("rounds", plan["rounds"]),
        ("window", plan["window"]),
        ("params", f"{plan['params'] / 1e6:.2f} M"),
    ]
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
    print(f"{'field':<13} {'value':<14} reason")
    for k, v in rows:
        print(f"{k:<13} {v!s:<14} {plan['reasons'].get(k, '')}")


def _print_presets(presets: list[dict[str, Any]]) -> None:
    print(
        f"{'preset':<16} {'architecture':<20} {'L':>3} {'d':>5} {'experts':>8} "
        f"{'params':>9} {'active':>9} {'bf16 state':>11}"
    )
    for p in presets:
        experts = f"{p['experts_per_token']}/{p['experts']}" if p["experts"] else "-"
        print(
            f"{p['name']:<16} {p['architecture']:<20} {p['layers']:>3} "
            f"{p['hidden_size']:>5} {experts:>8} {p['params_total'] / 1e9:>8.3f}B "
            f"{p['params_active'] / 1e9:>8.3f}B "
            f"{p['training_state_bytes']['bf16'] / GIB:>7.1f} GiB"
        )


def _follow(client: httpx.Client, job_id: str, poll_s: float = 1.0) -> int:
    after = None
    while True:
        params: dict[str, str] = {"after": after} if after else {}
        for ev in _call(client, "GET", f"/v1/jobs/{job_id}/events", params=params):
            print(
                f"{time.strftime('%H:%M:%S', time.localtime(ev['ts']))} {ev['kind']:<10} "
                f"{ev['message']}"
            )
            after = ev["id"]
        job = _call(client, "GET", f"/v1/jobs/{job_id}")
        if JobState(job["state"]) in TERMINAL_STATES:
            return 0 if job["state"] == JobState.succeeded.value else 1
        time.sleep(poll_s)


def _report(client: httpx.Client, job_id: str, out: str | None) -> None:
    from wstrain.service import report  # matplotlib: only for this command (0.3 s to import)

    job, events = report.fetch(
        lambda path, params: _call(client, "GET", path, params=params), job_id
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


def _run_client(args: argparse.Namespace) -> int:
    with _client(args) as c:
        if args.cmd == "submit":
            job = _call(c, "POST", "/v1/jobs", json=_load_spec(args.spec))
            print(job["id"])
            return _follow(c, job["id"]) if args.follow else 0
        if args.cmd == "plan":
            _print_plan(_call(c, "POST", "/v1/plans", json=_load_spec(args.spec)))
        elif args.cmd == "ls":
            params = {k: v for k, v in (("state", args.state), ("owner", args.owner)) if v}
            listing = _call(c, "GET", "/v1/jobs", params=params)
            print(f"{'id':<13} {'state':<11} {'step':>11} {'loss':>8}  name")
            for j in listing["jobs"]:
                print(
                    f"{j['id']:<13} {j['state']:<11} {str(j['step']) + '/' + str(j['steps']):>11}"
                    f" {_fmt(j['loss']):>8}  {j['name']}"
                )
        elif args.cmd == "status":
            job = _call(c, "GET", f"/v1/jobs/{args.id}")
            if args.json:
                print(json.dumps(job, indent=1))
            else:
                _print_job(job)
        elif args.cmd == "presets":
            _print_presets(_call(c, "GET", "/v1/presets")["presets"])
        elif args.cmd == "report":
            _report(c, args.id, args.out)
        elif args.cmd in ("cancel", "resume"):
            job = _call(c, "POST", f"/v1/jobs/{args.id}/{args.cmd}")
            print(f"{job['id']} {job['state']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wstrain", description="wstrain training service")
    p.add_argument("--server", default=os.environ.get("WSTRAIN_URL", "http://127.0.0.1:8000"))
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the API, one scheduler agent and (if needed) Redis")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--state-dir", type=Path, default=Path("wstrain-state"))
    s.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("WSTRAIN_METRICS_PORT", "9464")),
        help="port of the agent's /metrics (job series), on --host",
    )
    s = sub.add_parser("submit", help="submit a job spec (YAML or JSON)")
    s.add_argument("spec")
    s.add_argument("--follow", action="store_true", help="stream events until the job ends")
    sub.add_parser("plan", help="show the plan a spec would get").add_argument("spec")
    s = sub.add_parser("ls", help="list jobs")
    s.add_argument("--state", choices=[st.value for st in JobState])
    s.add_argument("--owner")
    s = sub.add_parser("status", help="show one job")
    s.add_argument("id")
    s.add_argument("--json", action="store_true")
    sub.add_parser("cancel", help="cancel a job (checkpoint, then stop)").add_argument("id")
    sub.add_parser("resume", help="resume a cancelled/failed job").add_argument("id")
    sub.add_parser("presets", help="list model presets: sizes, experts, training state")
    s = sub.add_parser("report", help="write one self-contained HTML page of a job's plots")
    s.add_argument("id")
    s.add_argument("-o", "--out", help="the HTML file to write (default: report-ID.html)")
    s = sub.add_parser(
        "prepare",
        help="tokenize text/JSONL/Parquet/datasets dir into a token file (all cores, resumable)",
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
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request drowns the output
    if args.cmd == "serve":
        from wstrain.service.serve import serve  # uvicorn and process management only when serving

        return serve(args.host, args.port, args.state_dir, args.metrics_port)
    try:
        return _prepare(args) if args.cmd == "prepare" else _run_client(args)
    except CliError as exc:
        print(f"wstrain: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
