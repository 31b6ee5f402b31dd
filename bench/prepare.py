"""`wstrain prepare` against tokenizers' own `encode_batch`, side by side in one run: the same
JSONL documents, the same tokenizer, the same cores. Then a short job trains on the result.

    python -m bench.prepare --gib 1 --out bench/results/<date>-dev-prepare.json

1. A corpus: every .py/.md/.rst/.txt file of this Python installation is a document, cycled
   until the JSONL holds --gib GiB (real text, ~200 MB of it distinct; repetition only
   helps the baseline, whose BPE word cache then hits more often).
2. A byte-level BPE tokenizer (32K merges) trained on 16 MiB of it, with <|endoftext|>.
3. Baseline: the documents loaded into memory first (not timed), then `encode_batch` (and
   `encode_batch_fast`) over batches of 8 MiB of text, on every core (tokenizers' rayon
   pool), results dropped: tokenizing and nothing else.
4. `wstrain prepare` from the file on disk to the token file, timed end to end as a
   subprocess, its process tree's RSS (sum over the parent and its workers) sampled every
   50 ms; the peak is the row's `prepare_peak_rss_gib`.
5. Two training steps of a tiny Llama on the token file (CPU, resident runtime).

Needs tokenizers and the worker's dependencies (torch, numpy), not the service's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from wstrain.contracts.calibration import GIB
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import OptimizerSpec, TokenData
from wstrain.worker.io.data import TokenStream
from wstrain.worker.runtime.resident import ResidentRuntime, RuntimeConfig

BASELINE_BATCH_BYTES = 8 << 20


def _texts() -> Iterator[str]:
    roots = {Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["stdlib"])}
    for root in sorted(roots):
        for path in sorted(root.rglob("*")):
            if path.suffix in (".py", ".md", ".rst", ".txt") and path.is_file():
                try:
                    text = path.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                if 64 <= len(text) <= 1 << 20:
                    yield text


def make_corpus(path: Path, size_bytes: int) -> int:
    docs, written = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size_bytes:
            for text in _texts():
                line = json.dumps({"text": text}) + "\n"
                f.write(line)
                written, docs = written + len(line.encode()), docs + 1
                if written >= size_bytes:
                    break
    return docs


def train_tokenizer(corpus: Path, out: Path) -> None:
    def sample() -> Iterator[str]:
        seen = 0
        with open(corpus, encoding="utf-8") as f:
            for line in f:
                text = json.loads(line)["text"]
                seen += len(text)
                yield text
                if seen > 16 << 20:
                    return

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32768,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(sample(), trainer)
    tok.save(str(out))


def baseline(corpus: Path, tokenizer: Path, method: str) -> dict[str, float]:
    tok = Tokenizer.from_file(str(tokenizer))
    batches: list[list[str]] = [[]]
    size = 0
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            batches[-1].append(json.loads(line)["text"])
            size += len(batches[-1][-1])
            if size >= BASELINE_BATCH_BYTES:
                batches.append([])
                size = 0
    encode = getattr(tok, method)
    tokens = 0
    start = time.perf_counter()
    for batch in batches:
        tokens += sum(len(e.ids) for e in encode(batch))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": tokens, "docs": sum(map(len, batches))}


def _tree_rss_bytes(root: int) -> int:
    """RSS of `root` and every descendant, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def run_prepare(corpus: Path, tokenizer: Path, out: Path) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-m",
        "wstrain.cli.main",
        "prepare",
        str(corpus),
        str(out),
        "--tokenizer",
        str(tokenizer),
    ]
    peak = [0]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    if rc:
        raise SystemExit(f"wstrain prepare exited {rc}")
    header = json.loads(out.with_suffix(".json").read_text())
    return {
        "seconds": seconds,
        "tokens": header["tokens"],
        "docs": header["documents"],
        "peak_rss_bytes": peak[0],
    }


def train_on(out: Path) -> list[float]:
    """Two steps of a 2-layer Llama on the token file, the worker's own data path."""
    torch.manual_seed(0)
    dims = ModelDims(
        vocab_size=32768,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
    )
    data = TokenStream.open(
        TokenData(kind="tokens", path=str(out)), dims.vocab_size, 128, 0, global_batch=4
    )
    runtime = ResidentRuntime(
        dims, RuntimeConfig("fp32", "cpu", 2, 2, 2, 0, seq_len=128), OptimizerSpec()
    )
    return [runtime.train_step(data, step).loss for step in range(2)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--dir", type=Path, default=None, help="scratch (default: a temp dir)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    scratch = args.dir or Path(tempfile.mkdtemp(prefix="wstrain-prepare-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer = scratch / "corpus.jsonl", scratch / "tokenizer.json"
    if not corpus.exists():
        make_corpus(corpus, int(args.gib * GIB))
    if not tokenizer.exists():
        train_tokenizer(corpus, tokenizer)
    out = scratch / "corpus.bin"
    for stale in (out, out.with_suffix(".json"), out.with_suffix(".idx")):
        stale.unlink(missing_ok=True)
    size = corpus.stat().st_size
    base = baseline(corpus, tokenizer, "encode_batch")
    fast = baseline(corpus, tokenizer, "encode_batch_fast")
    ours = run_prepare(corpus, tokenizer, out)
    assert ours["tokens"] == base["tokens"] + base["docs"], "prepare's ids differ in count"
    losses = train_on(out)
    row = {
        "bench": "prepare",
        "host": platform.node(),
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "input_bytes": size,
        "documents": base["docs"],
        "tokens": ours["tokens"],
        "encode_batch_s": round(base["seconds"], 2),
        "encode_batch_fast_s": round(fast["seconds"], 2),
        "prepare_s": round(ours["seconds"], 2),
        "encode_batch_mib_per_s": round(size / 2**20 / base["seconds"], 2),
        "prepare_mib_per_s": round(size / 2**20 / ours["seconds"], 2),
        "prepare_vs_encode_batch": round(base["seconds"] / ours["seconds"], 3),
        "prepare_vs_encode_batch_fast": round(fast["seconds"] / ours["seconds"], 3),
        "prepare_peak_rss_gib": round(ours["peak_rss_bytes"] / GIB, 3),
        "train_losses": losses,
    }
    print(json.dumps(row, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([row], indent=2) + "\n")


if __name__ == "__main__":
    main()
