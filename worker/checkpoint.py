"""Checkpoints: weights as safetensors with Hugging Face names (+ config.json, so
`LlamaForCausalLM.from_pretrained(dir)` loads them), optimizer and LR-schedule state, step,
data position and RNG state. Written atomically: into a temp dir, fsynced, renamed, then
the `latest` pointer replaced.

    ckpt = latest(job_dir / "checkpoints");  state = load(ckpt, model, optimizer, schedule)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

log = logging.getLogger(__name__)

LATEST = "latest"


@dataclass(frozen=True)
class TrainerState:
    step: int  # optimizer steps completed
    data_position: int  # the next batch to read (= step: data order is a function of it)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(root: Path, state: TrainerState, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer, schedule: torch.optim.lr_scheduler.LRScheduler,
         hf_config: dict[str, object]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{state.step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(hf_config, indent=1))
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save({"optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                "rng": rng}, tmp / "optimizer.pt")
    (tmp / "trainer.json").write_text(json.dumps(state.__dict__))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():  # a re-run of the same step after a crash: replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / LATEST)
    _fsync_dir(root)
    log.info("checkpoint written: %s", final)
    return final


def latest(root: Path) -> Path | None:
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if path.is_dir() else None


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         schedule: torch.optim.lr_scheduler.LRScheduler) -> TrainerState:
    weights = load_file(path / "model.safetensors")
    model.load_state_dict(weights, strict=True)
    extra = torch.load(path / "optimizer.pt", weights_only=False)
    optimizer.load_state_dict(extra["optimizer"])
    schedule.load_state_dict(extra["schedule"])
    torch.set_rng_state(extra["rng"]["torch"])
    if "cuda" in extra["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(extra["rng"]["cuda"])
    return TrainerState(**json.loads((path / "trainer.json").read_text()))
