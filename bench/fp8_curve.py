"""fp8 saved activations against bf16: the loss curve of a small Llama trained 2,000 steps
by the working-set runtime with every saved set sent home, in bf16 with two seeds and with
activation_precision="fp8" (working_set/fp8_saves.py) on the first seed. fp8 passes when
its smoothed curve stays within the spread of the two bf16 seeds.

    python -m bench.fp8_curve --steps 2000 --out bench/results/X.json
    python -m bench.fp8_curve --summarize bench/results/X.json     # the summary again, CPU

Needs a GPU. The three runs go concurrently, each in its own process on the one GPU (the
model is 4 small layers: none fills the chip, and concurrency changes speed, never a loss).
The data: a fixed random Markov chain over 512 tokens (each token has four
successors with probabilities 0.55/0.25/0.15/0.05: an entropy floor of 1.109 nats), the
same batches for every run.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import OptimizerSpec
from wstrain.worker.models.initial import initial_weights
from wstrain.worker.runtime.working_set.config import WorkingSetConfig
from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime
from wstrain.worker.runtime.working_set.state import HostState

log = logging.getLogger("bench.fp8_curve")

DIMS = ModelDims(512, 256, 768, 4, 4, 2, 64, 1e-5, 500000.0, 512)
SEQ, BATCH, VOCAB = 512, 8, 512
PROBS = torch.tensor([0.55, 0.25, 0.15, 0.05])


class MarkovBatches:
    """batch(step, round, n): n fresh sequences of the chain drawn from (step, round), so
    no run can memorise a pool (a fixed pool of 1,024 sequences let bf16 fall to 0.40 nats,
    under the chain's 1.109 floor, by step 2,000)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.next = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)  # each token's successors
        self.seq_len = SEQ

    def batch(self, step: int, round_idx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step * 1000 + round_idx)
        rows = torch.empty(n, SEQ + 1, dtype=torch.long)
        rows[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
        pick = torch.multinomial(PROBS.expand(n * SEQ, 4), 1, True, generator=g).view(n, SEQ)
        for i in range(SEQ):
            rows[:, i + 1] = self.next[rows[:, i], pick[:, i]]
        return rows[:, :-1], rows[:, 1:]

    def target_tokens(self, step: int, sequences: int) -> int:
        return sequences * SEQ


def run(seed: int, activation_precision: str, steps: int, device: str) -> list[float]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cuda = device == "cuda"
    host = HostState.create(DIMS, "bf16", pin=cuda, fused_adamw=cuda)
    host.load_tensors(initial_weights(DIMS, seed))
    cfg = WorkingSetConfig(
        precision="bf16",
        device=device,
        micro_batch=BATCH // 2,
        chunk=2,
        rounds=2,
        steps=steps,
        seed=seed,
        seq_len=SEQ,
        window=0,  # every (layer, chunk) sends its set home: all of it through fp8
        levels=tuple((3, 3) for _ in range(DIMS.num_layers)),
        activation_precision=activation_precision,
    )
    rt = WorkingSetRuntime(DIMS, cfg, OptimizerSpec(lr=1e-3, warmup_steps=100), host)
    data, losses = MarkovBatches(), []
    t0 = time.perf_counter()
    for step in range(steps):
        losses.append(rt.train_step(data, step).loss)
        if step % 200 == 0:
            log.info("%s seed %d step %d loss %.4f", activation_precision, seed, step, losses[-1])
    log.info("%s seed %d: %.1f s", activation_precision, seed, time.perf_counter() - t0)
    return losses


def smooth(xs: list[float], window: int = 50) -> list[float]:
    """Trailing means over `window` steps."""
    out = []
    for i in range(len(xs)):
        part = xs[max(0, i - window + 1) : i + 1]
        out.append(sum(part) / len(part))
    return out


def summarize(runs: dict[str, list[float]], gpu: str) -> dict[str, object]:
    """fp8 against the two bf16 seeds, on curves smoothed over 50 steps: the last 200 steps'
    means, the share of the second half inside the seeds' spread (with 0.01 nats of slack,
    and strictly), and how far outside it fp8 goes at most past step 50."""
    steps = len(runs["fp8-seed0"])
    s = {k: smooth(v) for k, v in runs.items()}
    lo = [min(a, b) for a, b in zip(s["bf16-seed0"], s["bf16-seed1"])]
    hi = [max(a, b) for a, b in zip(s["bf16-seed0"], s["bf16-seed1"])]
    f = s["fp8-seed0"]
    half = range(steps // 2, steps)  # past the early transient, where seeds differ most
    start = min(50, steps // 2)
    outside = [max(0.0, lo[i] - f[i], f[i] - hi[i]) for i in range(start, steps)]
    tail = {k: sum(v[-200:]) / len(v[-200:]) for k, v in runs.items()}
    return {
        "gpu": gpu,
        "steps": steps,
        "last200_mean": tail,
        "fp8_minus_bf16_seed0": tail["fp8-seed0"] - tail["bf16-seed0"],
        "bf16_seed_spread": abs(tail["bf16-seed1"] - tail["bf16-seed0"]),
        "second_half_inside_spread_share": sum(outside[i - start] <= 0.01 for i in half)
        / len(half),
        "second_half_strictly_inside_share": sum(outside[i - start] == 0 for i in half) / len(half),
        "max_nats_outside_spread_from_step_50": max(outside),
        "max_seed_spread_from_step_50": max(hi[i] - lo[i] for i in range(start, steps)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--out")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run")
    p.add_argument("--summarize", help="a finished run's file: add its summary, run nothing")
    args = p.parse_args()
    if args.summarize:
        with open(args.summarize) as f:
            done = json.load(f)
        done["summary"] = summarize(done["losses"], done.get("summary", {}).get("gpu", "?"))
        with open(args.summarize, "w") as f:
            json.dump(done, f)
        print(json.dumps(done["summary"], indent=1))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    runs: dict[str, list[float]] = {}
    plan = {"bf16-seed0": (0, "bf16"), "fp8-seed0": (0, "fp8"), "bf16-seed1": (1, "bf16")}
    spawn = multiprocessing.get_context("spawn")  # CUDA cannot follow a fork
    with ProcessPoolExecutor(len(plan), mp_context=spawn) as pool:
        futures = {
            pool.submit(run, seed, act, args.steps, args.device): name
            for name, (seed, act) in plan.items()
        }
        for done in as_completed(futures):
            runs[futures[done]] = done.result()
            if args.out:  # each run as it ends: a cut-off session keeps what it had
                with open(args.out, "w") as f:
                    json.dump({"losses": runs}, f)
    summary = summarize(runs, "cpu" if args.device == "cpu" else torch.cuda.get_device_name(0))
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "losses": runs}, f)


if __name__ == "__main__":
    main()
