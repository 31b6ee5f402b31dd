"""`document_mask` on the GPU: the resident and working-set runtimes with and without it, on
one prepared token file of packed documents, Llama-3-8B dims with a few layers. Each row is
a child process; it reports tokens/s, the device memory peak and its per-step losses, so
the two runtimes' losses under the mask can be compared (bf16) and the mask's cost read.

    PYTHONPATH=/tmp/site:$PWD/src:$PWD python3 -m bench.documents --layers 4 --seq 8192 \
        --out bench/results/<date>-h100-documents.json

The documents: random bytes in lengths drawn log-uniformly from 64 to 16K, prepared with the
byte tokenizer (`wstrain prepare`), so a sequence of 8K holds a few documents and cuts one.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.specs import llama_spec
from bench.working_set import measured_node
from wstrain.contracts.calibration import GIB
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import TokenData
from wstrain.planning.planner import make_plan
from wstrain.prepare.pipeline import PrepareRequest, prepare
from wstrain.worker.build import build_runtime
from wstrain.worker.io.data import TokenStream

ROWS = {  # name: (runtime, device budget GiB, document_mask)
    "resident": ("resident", 60.0, False),
    "resident-docs": ("resident", 60.0, True),
    "ws-12": ("working_set", 12.0, False),
    "ws-12-docs": ("working_set", 12.0, True),
}


def make_data(path: Path, total_bytes: int) -> Path:
    rng = random.Random(0)
    written = 0
    with open(path, "w") as f:
        while written < total_bytes:
            n = int(math.exp(rng.uniform(math.log(64), math.log(16384))))
            text = "".join(rng.choice("abcdefghij klmnop") for _ in range(n))
            f.write(json.dumps({"text": text}) + "\n")
            written += n
    out = path.with_suffix(".bin")
    prepare(PrepareRequest(str(path), str(out)))
    return out


def run_row(name: str, args: argparse.Namespace, data: Path) -> dict[str, object]:
    runtime, budget, docs = ROWS[name]
    spec = llama_spec(
        name, args.layers, args.seq, args.global_batch, args.steps, budget, 96.0,
        {"runtime": runtime},
    )  # fmt: skip
    spec = spec.model_copy(
        update={"data": TokenData(kind="tokens", path=str(data)), "document_mask": docs}
    )
    dims = resolve_dims(spec.model)
    plan = make_plan(spec, dims, measured_node(args.seq, dims))
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, spec.budget.device_bytes / total), 0)
    rt = build_runtime(spec, plan)
    stream = TokenStream.open(
        spec.data, dims.vocab_size, spec.seq_len, 0, global_batch=spec.global_batch
    )
    torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        losses.append(rt.train_step(stream, step).loss)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    rt.finish()
    tokens = args.global_batch * args.seq
    return {
        "row": name,
        "runtime": plan.runtime,
        "micro_batch": plan.micro_batch,
        "document_mask": docs,
        "device_budget_gib": budget,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
        "tokens_per_s": tokens / statistics.median(times[1:]),
        "step_s": times,
        "losses": losses,
        "gpu": torch.cuda.get_device_name(0),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--data", type=Path, default=Path("/tmp/wstrain-docs/docs.jsonl"))
    p.add_argument("--row", help=argparse.SUPPRESS)  # a child: run this row only
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    data = args.data.with_suffix(".bin")
    if args.row:
        print(json.dumps(run_row(args.row, args, data)))
        return
    args.data.parent.mkdir(parents=True, exist_ok=True)
    make_data(args.data, args.seq * args.global_batch * (args.steps + 2) * 2)
    rows = []
    for name in args.rows.split(","):
        child = subprocess.run(
            [sys.executable, "-m", "bench.documents", *sys.argv[1:], "--row", name],
            capture_output=True, text=True,
        )  # fmt: skip
        if child.returncode:
            rows.append({"row": name, "error": child.stderr[-3000:]})
        else:
            rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1])[:600], flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
