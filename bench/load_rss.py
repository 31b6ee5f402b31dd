"""Host memory while fine-tuning starts from a multi-GB Hugging Face checkpoint: peak RSS of
a worker process that builds the working-set runtime from a model directory (sharded
safetensors streamed tensor by tensor into the host tiles, worker/io/hf_load.py), against the
training state it holds (weights, gradients, two AdamW moments: the arena's bytes), with
checkpoint shards of several sizes.

    python -m bench.load_rss --params-b 1.0 --shard-gib 1 --out bench/results/X.json

Runs on a CPU (no GPU needed). The arena's tiles are touched before loading, as
cudaHostRegister does on a GPU host, so untouched zero pages do not flatter the number.
Each measurement runs in a fresh process; the driver writes the checkpoint first.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from wstrain.contracts.calibration import GIB
from wstrain.contracts.model_dims import ModelDims, resolve_dims
from wstrain.contracts.model_refs import PathModel
from wstrain.worker.io import checkpoint
from wstrain.worker.io.hf_load import stream_into
from wstrain.worker.runtime.stats import proc_status_bytes
from wstrain.worker.runtime.working_set.state import HostState

log = logging.getLogger("bench.load_rss")


def dims_for(params_b: float) -> ModelDims:
    """Llama-shaped dims (d 2048, FFN 5632, 16 heads, 32K vocab) with about params_b
    billion parameters, by layer count."""
    base = ModelDims(32000, 2048, 5632, 1, 16, 16, 128)
    layers = max(1, round((params_b * 1e9 - 2 * base.embedding_params) / base.layer_params))
    return ModelDims(32000, 2048, 5632, layers, 16, 16, 128)


def write_checkpoint(directory: Path, params_b: float, shard_gib: float) -> int:
    """A Hugging Face directory (config.json + sharded safetensors + index) of random bf16
    weights, written by the same code that writes wstrain's checkpoints."""
    dims = dims_for(params_b)
    host = HostState.create(dims, "bf16", pin=False)
    gen = torch.Generator().manual_seed(0)
    for tile in [*host.weights, host.embed_w, host.head_w]:
        tile.copy_(torch.randn(tile.numel(), generator=gen, dtype=torch.bfloat16) * 0.02)
    checkpoint.SHARD_BYTES = int(shard_gib * GIB)
    directory.mkdir(parents=True, exist_ok=True)
    checkpoint._save_sharded(host.weight_views(), directory)
    (directory / "config.json").write_text(json.dumps(dims.to_hf_config(), indent=1))
    return dims.params


def load(directory: Path) -> dict[str, object]:
    """Child: the worker's two steps for a model directory (worker/build.py build_runtime):
    the host state's arena, then the weights streamed into its tiles; report RSS."""
    dims = resolve_dims(PathModel(path=str(directory)))
    baseline = proc_status_bytes("VmRSS")
    host = HostState.create(dims, "bf16", pin=False)
    for tile in host.arena.tensors.values():
        tile.zero_()  # resident pages, as pinning makes them
    before = proc_status_bytes("VmRSS")
    t0 = time.perf_counter()
    stream_into(host.weight_views(), directory)
    load_s = time.perf_counter() - t0
    peak, state_bytes = proc_status_bytes("VmHWM"), host.arena.total_bytes
    files = list(directory.glob("*.safetensors"))
    return {
        "params": dims.params,
        "arena_bytes": state_bytes,
        "arena_by_kind": host.arena.bytes_by_kind,
        "baseline_rss_bytes": baseline,
        "rss_before_load_bytes": before,
        "peak_rss_bytes": peak,
        "load_s": load_s,
        "overhead_bytes": peak - baseline - state_bytes,
        "overhead_share_of_state": (peak - baseline - state_bytes) / state_bytes,
        "checkpoint_bytes": sum(f.stat().st_size for f in files),
        "largest_shard_bytes": max(f.stat().st_size for f in files),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params-b", type=float, default=1.0)
    p.add_argument("--shard-gib", type=float, nargs="+", default=[1.0, 4.0])
    p.add_argument("--load", type=Path, help=argparse.SUPPRESS)  # child mode
    p.add_argument("--out")
    args = p.parse_args()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    if args.load:
        print(json.dumps(load(args.load)), flush=True)
        return
    rows = []
    for shard_gib in args.shard_gib:
        with tempfile.TemporaryDirectory(prefix="wstrain-rss-") as tmp:
            directory = Path(tmp) / "model"
            params = write_checkpoint(directory, args.params_b, shard_gib)
            log.info("wrote %.2f B parameters in %.1f GiB shards", params / 1e9, shard_gib)
            proc = subprocess.run(
                [sys.executable, "-m", "bench.load_rss", "--load", str(directory)],
                capture_output=True,
                text=True,
                check=True,
            )
            row = {"shard_gib": shard_gib, **json.loads(proc.stdout.strip().splitlines()[-1])}
        rows.append(row)
        log.info(
            "shard %.1f GiB: state %.2f GiB, peak RSS %.2f GiB over a %.2f GiB baseline: "
            "overhead %.3f GiB (%.1f%% of the state), load %.1f s",
            shard_gib,
            row["arena_bytes"] / GIB,
            row["peak_rss_bytes"] / GIB,
            row["baseline_rss_bytes"] / GIB,
            row["overhead_bytes"] / GIB,
            100 * row["overhead_share_of_state"],
            row["load_s"],
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
