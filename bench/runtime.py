"""Runtime benchmark: resident PyTorch vs the working-set runtime at several device budgets,
Llama-3-8B dimensions, side by side. Each row runs in its own process (its own budget, its
own peak RSS); the driver prints a table and writes the raw rows as JSON.

    python -m bench.runtime --layers 16 --seq 8192 --global-batch 32 \
        --rows resident,resident-ckpt,ws-40,ws-20,ws-12 --out bench/results/X.json

Needs a GPU. Timed over whole steps after one warm-up step, optimizer included.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

log = logging.getLogger("bench.runtime")

PEAK_FLOPS = 989e12  # H100/H200 dense bf16, AdaWS's MFU denominator
GIB = 1024**3


@dataclass
class Row:
    name: str
    runtime: str
    layers: int
    seq_len: int
    device_budget_gib: float | None
    global_batch: int
    tokens_per_s: float
    mfu: float
    peak_device_gib: float
    peak_reserved_gib: float
    peak_rss_gib: float
    arena_gib: float | None
    stall_share: float | None
    stalls_s: dict[str, float]
    step_seconds: list[float]
    plan: dict[str, object]
    commit: str
    gpu: str


# Hand-made working-set plans per device budget (the autoconfigurator issue replaces these).
WS_PLANS: dict[str, dict[str, object]] = {
    "ws-40": {"budget": 40, "micro_batch": 8, "r_param": 3, "r_grad": 2, "window": 16,
              "level_last": 2, "levels_last_layers": 2, "loss_tokens": 2048},
    "ws-20": {"budget": 20, "micro_batch": 8, "r_param": 3, "r_grad": 2, "window": 8,
              "level_last": 0, "levels_last_layers": 0, "loss_tokens": 2048},
    "ws-12": {"budget": 12, "micro_batch": 4, "r_param": 2, "r_grad": 1, "window": 4,
              "level_last": 0, "levels_last_layers": 0, "loss_tokens": 1024},
}


def _rss_peak_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / GIB
    return 0.0


def _dims(layers: int):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from scheduler.model_dims import PRESETS

    return replace(PRESETS["llama3-8b"], num_layers=layers)


class RandomTokens:
    def __init__(self, vocab: int, seq_len: int, device: str) -> None:
        import torch

        self.vocab, self.seq_len, self.device = vocab, seq_len, device
        self.gen = torch.Generator(device="cpu").manual_seed(0)

    def batch(self, step: int, round_idx: int, n: int):  # type: ignore[no-untyped-def]
        import torch

        t = torch.randint(0, self.vocab, (n, self.seq_len + 1), generator=self.gen)
        return t[:, :-1], t[:, 1:]


def _time_steps(step_fn, steps: int) -> list[float]:  # type: ignore[no-untyped-def]
    import torch

    times = []
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step_fn(i)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        log.info("step %d: %.2f s", i, times[-1])
    return times


def run_resident(args: argparse.Namespace, ckpt: bool) -> dict[str, object]:
    import torch
    from torch.utils.checkpoint import checkpoint

    from worker.model import LlamaModel, causal_lm_loss, rope_tables

    dims = _dims(args.layers)
    with torch.device("cuda"):
        model = LlamaModel(dims).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = RandomTokens(dims.vocab_size, args.seq, "cuda")
    mb = args.resident_micro_batch
    rounds = args.global_batch // mb

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = model.model.embed_tokens(x)
        cos, sin = rope_tables(dims, x.shape[1], h.device, h.dtype)
        for layer in model.model.layers:
            h = checkpoint(layer, h, cos, sin, use_reentrant=False) if ckpt else layer(h, cos, sin)
        return model.lm_head(model.model.norm(h))

    def step(i: int) -> None:
        for r in range(rounds):
            x, y = data.batch(i, r, mb)
            loss = causal_lm_loss(forward(x.cuda()), y.cuda()) / rounds
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = _time_steps(step, args.steps)
    return {"times": times, "stalls": {}, "arena_gib": None,
            "plan": {"micro_batch": mb, "rounds": rounds, "checkpointing": ckpt}}


def run_working_set(args: argparse.Namespace, name: str) -> dict[str, object]:
    import torch

    from scheduler.contracts import OptimizerSpec
    from worker.state import HostState
    from worker.working_set import WorkingSetConfig, WorkingSetRuntime

    p = WS_PLANS[name]
    dims = _dims(args.layers)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, p["budget"] * GIB / total), 0)
    t0 = time.perf_counter()
    host = HostState.create(dims, "bf16", pin=True, fused_adamw=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for tile in [*host.weights, host.embed_w, host.head_w]:  # init on the GPU, copy home
        tile.copy_(torch.randn(tile.numel(), device="cuda", generator=g, dtype=torch.bfloat16) * 0.02)
    for k in range(dims.num_layers):  # RMSNorm weights start at one
        for n, v in host.layout.views(host.weights[k]).items():
            if n.endswith("layernorm.weight"):
                v.fill_(1.0)
    log.info("host state %.1f GiB ready in %.1f s", host.arena.total_bytes / GIB,
             time.perf_counter() - t0)
    L, mb = dims.num_layers, int(p["micro_batch"])
    levels = tuple(((int(p["level_last"]),) if k >= L - int(p["levels_last_layers"]) else (0,))
                   * mb for k in range(L))
    cfg = WorkingSetConfig(precision="bf16", device="cuda", micro_batch=mb, chunk=1,
                           rounds=args.global_batch // mb, steps=args.steps, seed=0,
                           seq_len=args.seq, r_param=int(p["r_param"]),
                           r_grad=int(p["r_grad"]), window=int(p["window"]), levels=levels,
                           loss_tokens=int(p["loss_tokens"]))
    rt = WorkingSetRuntime(dims, cfg, OptimizerSpec(lr=1e-4), host)
    data = RandomTokens(dims.vocab_size, args.seq, "cuda")
    stalls: dict[str, float] = {}

    def step(i: int) -> None:
        stats = rt.train_step(data, i)
        if i > 0:
            for k, v in stats.stall_s.items():
                stalls[k] = stalls.get(k, 0.0) + v
        log.info("step %d loss %.4f h2d %.1f GB d2h %.1f GB stalls %s", i, stats.loss,
                 stats.h2d_bytes / 1e9, stats.d2h_bytes / 1e9,
                 {k: round(v, 3) for k, v in stats.stall_s.items()})

    times = _time_steps(step, args.steps)
    plan = {k: v for k, v in asdict(cfg).items() if k != "levels"}
    plan["levels"] = [row[0] for row in levels]
    return {"times": times, "stalls": stalls, "arena_gib": host.arena.total_bytes / GIB,
            "plan": plan}


def run_row(args: argparse.Namespace) -> Row:
    import torch

    name = args.row
    dims = _dims(args.layers)
    if name.startswith("resident"):
        res = run_resident(args, ckpt=name == "resident-ckpt")
        budget = None
    else:
        res = run_working_set(args, name)
        budget = float(WS_PLANS[name]["budget"])
    timed = res["times"][1:]  # the first step is warm-up
    step_s = sum(timed) / len(timed)
    tokens_per_s = args.global_batch * args.seq / step_s
    stall_total = sum(res["stalls"].values()) / max(1, len(timed))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or os.environ.get("BENCH_COMMIT", "?")
    return Row(name=name, runtime="resident" if budget is None else "working_set",
               layers=args.layers, seq_len=args.seq, device_budget_gib=budget,
               global_batch=args.global_batch, tokens_per_s=tokens_per_s,
               mfu=dims.flops_per_token(args.seq) * tokens_per_s / PEAK_FLOPS,
               peak_device_gib=torch.cuda.max_memory_allocated() / GIB,
               peak_reserved_gib=torch.cuda.max_memory_reserved() / GIB,
               peak_rss_gib=_rss_peak_gib(), arena_gib=res["arena_gib"],
               stall_share=None if budget is None else stall_total / step_s,
               stalls_s={k: v / len(timed) for k, v in res["stalls"].items()},
               step_seconds=res["times"], plan=res["plan"], commit=commit,
               gpu=torch.cuda.get_device_name(0))


def _table(rows: list[dict[str, object]]) -> str:
    head = (f"{'row':<14}{'batch':>6}{'tok/s':>9}{'MFU':>7}{'dev GiB':>9}{'rsv GiB':>9}"
            f"{'RSS GiB':>9}{'arena':>7}{'stall':>7}")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['name']:<14} FAILED: {r['error'][:100]}")
            continue
        arena = f"{r['arena_gib']:.1f}" if r["arena_gib"] else "-"
        stall = f"{r['stall_share']:.1%}" if r["stall_share"] is not None else "-"
        lines.append(f"{r['name']:<14}{r['global_batch']:>6}{r['tokens_per_s']:>9.0f}"
                     f"{r['mfu']:>7.1%}{r['peak_device_gib']:>9.1f}{r['peak_reserved_gib']:>9.1f}"
                     f"{r['peak_rss_gib']:>9.1f}{arena:>7}{stall:>7}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--resident-micro-batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="1 warm-up + timed steps")
    p.add_argument("--rows", default="resident,resident-ckpt,ws-40,ws-20,ws-12")
    p.add_argument("--row", help=argparse.SUPPRESS)  # child mode: run one row
    p.add_argument("--out")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s: %(message)s")
    if args.row:
        print(json.dumps(asdict(run_row(args))), flush=True)
        return
    rows = []
    for name in args.rows.split(","):
        cmd = [sys.executable, "-m", "bench.runtime", "--row", name, "--layers",
               str(args.layers), "--seq", str(args.seq), "--global-batch",
               str(args.global_batch), "--steps", str(args.steps),
               "--resident-micro-batch", str(args.resident_micro_batch)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(proc.stderr[-3000:])
        if proc.returncode == 0:
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        else:
            err = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "?"
            rows.append({"name": name, "error": err, "global_batch": args.global_batch})
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    print(_table(rows))


if __name__ == "__main__":
    main()
