"""Today's planner against every measured long-context row: each row of
`bench/results/long-context/` planned again on the node profile its own run measured, with
the layout it ran pinned (micro-batch, window, slots, optimizer, piece length, the window's
home), so the same plan costed today, beside the step it measured. The check behind
"predicted step within 10% at every row", run on any CPU after a change to the cost model;
the rows themselves are never re-measured here.

    python -m bench.replan --out bench/results/planner/X.json
    python -m bench.replan --predict 262144,524288 --layers 32 --host-gib 256 \
        --profile-of fa3-vs-cudnn-128k-h100-2026-11-28.json:long-131072

A row timed over one step has its warm-up in it (`step_seconds` starts 0.0: the 1M rows,
the profiled row); the summary keeps those apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
from pathlib import Path
from typing import Any

from bench.specs import llama_dims, llama_spec, node_from_row
from wstrain.contracts.calibration import GIB
from wstrain.planning.planner import make_plan

ROWS_DIR = Path(__file__).parent / "results" / "long-context"
# the host budget of rows older than plan.host_gib: their file's name, else the bench's
# default (bench/long_context.py --host-gib)
DEFAULT_HOST_GIB = 110.0


def measured_rows(folder: Path = ROWS_DIR) -> list[tuple[str, dict[str, Any]]]:
    """(file name, row) for every bench.long_context row (named long-...), in file order;
    the folder's other rows come from benches that plan their own way (bench.data_parallel's
    ws-N)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        for row in data if isinstance(data, list) else []:
            if str(row.get("name", "")).startswith("long-") and row.get("measured_step_seconds"):
                out.append((path.name, row))
    return out


def warm_up_timed(row: dict[str, Any]) -> bool:
    """Whether the row's one timed step is its warm-up (bench.long_context --steps 1 puts a
    0.0 before it)."""
    return float((row.get("step_seconds") or [1.0])[0]) == 0.0


def _levels(levels: list[list[int]]) -> list[int]:
    """Units at each level, as bench rows record a plan's levels."""
    return [sum(r.count(lv) for r in levels) for lv in range(4)]


def replan(file: str, row: dict[str, Any]) -> dict[str, Any]:
    """The row planned again today, on its own node profile, its layout pinned."""
    plan, name = row["plan"], str(row["name"])
    ran = plan.get("working_set") or {}
    named = re.search(r"host-(\d+)gib", file)
    host_gib = plan.get("host_gib") or (float(named.group(1)) if named else DEFAULT_HOST_GIB)
    docs = int(plan.get("document_tokens") or 0)
    node = node_from_row(row).with_documents(docs)
    if "-cudnn" in name:  # run with FA3 off: planned without its rates
        node = dataclasses.replace(node, fa3_attention_points=())
    pinned: dict[str, object] = {  # the layout it ran: the same plan, costed today
        "micro_batch": plan["micro_batch"],
        "window": plan["window"],
        "seq_chunk": int(ran.get("seq_chunk") or 0),
        "window_home": bool(ran.get("window_home", False)),  # older rows: on the device
        "write_buffer_gib": int(ran.get("write_buffer_bytes") or GIB) / GIB,  # older: 1 GiB
        **{
            k: ran[k]
            for k in ("r_param", "r_grad", "optimizer", "lead_rounds", "overlap")
            if k in ran
        },
    }
    layers, seq = int(row["layers"]), int(row["seq_len"])
    spec = llama_spec(
        name, layers, seq, int(row.get("global_batch") or 1), 2,
        float(row.get("device_budget_gib") or 24.0), float(host_gib), pinned,
        activation_precision="fp8" if name.endswith("-fp8") else "bf16",
    )  # fmt: skip
    spec = spec.model_copy(update={"document_mask": docs > 0})
    today = make_plan(spec, llama_dims(layers), node)
    ws = today.working_set
    step_s = float(row["measured_step_seconds"])
    recorded_s = float(row.get("predicted_step_seconds") or plan["predicted"]["step_seconds"])
    return {
        "file": file,
        "name": name,
        "layers": layers,
        "seq_len": seq,
        "global_batch": int(row.get("global_batch") or 1),
        "seq_chunk": pinned["seq_chunk"],
        "window_home": pinned["window_home"],
        "attention_kernel": row.get("attention_kernel") or ran.get("attention_kernel"),
        "warm_up_timed": warm_up_timed(row),
        "measured_step_seconds": step_s,
        "recorded_predicted_step_seconds": recorded_s,
        "recorded_error": recorded_s / step_s - 1,
        "predicted_step_seconds": today.predicted.step_seconds,
        "predicted_compute_seconds": today.predicted.compute_seconds,
        "predicted_recompute_seconds": today.predicted.recompute_seconds,
        "error": today.predicted.step_seconds / step_s - 1,
        "same_levels": ws is not None and _levels(ws.levels) == list(ran.get("levels") or []),
    }


def predict(
    profile_of: str, lengths: list[int], layers: int, host_gib: float
) -> list[dict[str, Any]]:
    """Rows not run (a host no lent machine has): each length planned at `layers` on the
    node profile of the measured row `profile_of` ("FILE:NAME"), its tokens/s as predicted
    and times the measured over predicted steps of the rows of that run (the same profile,
    the same kernel, timed after a warm-up)."""
    file, name = profile_of.split(":")
    rows = measured_rows()
    src = next(r for f, r in rows if f == file and r["name"] == name)
    node = node_from_row(src)
    run = [
        replan(f, r)
        for f, r in rows
        if r["plan"]["node"] == src["plan"]["node"] and not warm_up_timed(r)
    ]
    out = []
    for seq in lengths:
        spec = llama_spec(f"long-{seq}", layers, seq, 1, 2, 24.0, host_gib, {})
        plan = make_plan(spec, llama_dims(layers), node)
        assert plan.working_set is not None  # long context plans the working set
        kernel = plan.working_set.attention_kernel
        steady = [r for r in run if r["attention_kernel"] == kernel]
        ratio = statistics.mean(
            r["predicted_step_seconds"] / r["measured_step_seconds"] for r in steady
        )
        out.append(
            {
                "seq_len": seq,
                "layers": layers,
                "host_gib": host_gib,
                "profile_of": profile_of,
                "attention_kernel": kernel,
                "seq_chunk": plan.working_set.seq_chunk,
                "predicted_step_seconds": plan.predicted.step_seconds,
                "predicted_tokens_per_s": seq / plan.predicted.step_seconds,
                "ratio_rows": [f"{r['file']}:{r['name']}" for r in steady],
                "predicted_over_measured": ratio,
                "tokens_per_s_at_that_ratio": seq / plan.predicted.step_seconds * ratio,
            }
        )
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Errors over the rows timed after a warm-up and over the rest."""
    out: dict[str, Any] = {}
    for key, part in (("steady", False), ("warm_up_timed", True)):
        errs = [r["error"] for r in rows if r["warm_up_timed"] is part]
        if errs:
            out[key] = {
                "rows": len(errs),
                "mean_abs_error": statistics.mean(abs(e) for e in errs),
                "least_error": min(errs),
                "most_error": max(errs),
                "within_10_percent": sum(abs(e) <= 0.10 for e in errs),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="", help="write the rows and the summary here")
    ap.add_argument("--predict", default="", help="comma-separated lengths not run: predict")
    ap.add_argument("--layers", type=int, default=32, help="--predict: layers")
    ap.add_argument("--host-gib", type=float, default=256.0, help="--predict: host budget")
    ap.add_argument("--profile-of", default="", help="--predict: FILE:NAME, a measured row")
    args = ap.parse_args()
    if args.predict:
        lengths = [int(n) for n in args.predict.split(",")]
        result = predict(args.profile_of, lengths, args.layers, args.host_gib)
        print(json.dumps(result, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return
    rows = [replan(f, r) for f, r in measured_rows()]
    print(f"{'row':<60} {'measured':>9} {'recorded':>9} {'today':>9} {'error':>7}")
    for r in rows:
        label = f"{r['file'].removesuffix('.json')[:38]} {r['name']}"
        mark = " (warm-up timed)" if r["warm_up_timed"] else ""
        print(
            f"{label[:60]:<60} {r['measured_step_seconds']:>9.2f} "
            f"{r['recorded_predicted_step_seconds']:>9.2f} {r['predicted_step_seconds']:>9.2f} "
            f"{r['error']:>+7.1%}{mark}{'' if r['same_levels'] else ' (levels differ)'}"
        )
    result = {"rows": rows, "summary": summary(rows)}
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
