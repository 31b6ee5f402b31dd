"""Each benchmark row in its own Python process, as the agent runs workers (its own device
budget, its own peak RSS): the options every driver shares, the child mode that runs one
row and prints it as JSON, and the driver's loop that runs the children and collects their
rows. Used by bench/runtime.py, long_context, moe, sweep and data_parallel.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict

from bench.rows import Row
from wstrain.worker.kernels import fused as fused_ops


def parse_or_run_row(
    p: argparse.ArgumentParser, default_rows: str, run_row: Callable[[argparse.Namespace], Row]
) -> argparse.Namespace | None:
    """Add the options every benchmark driver shares (--steps, --rows, --out and the child's
    --row), parse, set up logging; in a child, run its row and print it (returns None)."""
    p.add_argument("--steps", type=int, default=3, help="1 warm-up + timed steps")
    p.add_argument("--rows", default=default_rows)
    p.add_argument("--row", help=argparse.SUPPRESS)  # child mode: run one row
    p.add_argument("--out")
    p.add_argument(
        "--eager-kernels",
        action="store_true",
        help="run PyTorch's eager elementwise ops instead of worker/kernels/fused.py",
    )
    args = p.parse_args()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    if args.row:
        fused_ops.ENABLED = not args.eager_kernels
        row = run_row(args)
        row.kernels = "eager" if args.eager_kernels else "fused"
        print(json.dumps(asdict(row)), flush=True)
        return None
    return args


def run_child(argv: list[str], env: dict[str, str]) -> tuple[dict[str, object] | None, str]:
    """Run one child Python process: (the row it printed as its last stdout line, or None
    where it failed; its last stderr line). Its stderr streams through as it comes, so a
    command stopped at the device tool's limit still shows how far a long row got."""
    with tempfile.TemporaryFile("w+") as stdout:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stderr is not None
        last = "?"
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            last = line.strip() or last
        stdout.seek(0)
        lines = stdout.read().strip().splitlines()
    ok = proc.wait() == 0 and lines
    return (json.loads(lines[-1]) if ok else None), last


def run_children(
    children: list[tuple[list[str], dict[str, object]]], out: str | None
) -> list[dict[str, object]]:
    """Run each (module + args, identity) in its own Python process, as the workers run:
    each child prints its row as the last line of stdout; a failed child's row carries the
    last line of its stderr. Rows are written to `out` after each child."""
    rows: list[dict[str, object]] = []
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    for argv, identity in children:
        row, last = run_child([sys.executable, "-m", *argv], env)
        rows.append(row if row is not None else {**identity, "error": last})
        if out:
            with open(out, "w") as f:
                json.dump(rows, f, indent=1)
    return rows
