"""Checkpoints round-trip: `AutoModelForCausalLM.from_pretrained` loads what the worker writes
(Llama and Qwen3) and gives the same logits; loading into the worker restores weights,
optimizer and step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from wstrain.contracts.model_dims import PRESETS
from wstrain.contracts.spec import OptimizerSpec
from wstrain.worker.io import checkpoint
from wstrain.worker.models.dense import LlamaModel, causal_lm_loss
from wstrain.worker.models.initial import init_model
from wstrain.worker.runtime.optim import make_adamw


def _trained_and_saved(root: Path, steps: int, preset: str = "micro-llama"):  # type: ignore[no-untyped-def]
    """A small model trained `steps` steps, and the checkpoint written of it."""
    dims = PRESETS[preset]
    model = LlamaModel(dims)
    init_model(model, dims, seed=0)
    opt, sched = make_adamw(model.parameters(), OptimizerSpec(lr=1e-2), 10)
    for _ in range(steps):
        tokens = torch.randint(0, dims.vocab_size, (2, 9))
        causal_lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    extra = {"optimizer": opt.state_dict(), "schedule": sched.state_dict()}
    path = checkpoint.save(
        root, checkpoint.TrainerState(steps, steps), model.state_dict(), extra, dims.to_hf_config()
    )
    return dims, model, opt, sched, path


@pytest.mark.parametrize("preset", ["micro-llama", "tiny-qwen3"])
def test_transformers_loads_worker_checkpoint(tmp_path: Path, preset: str) -> None:
    dims, model, _, _, path = _trained_and_saved(tmp_path, 2, preset)
    assert checkpoint.latest(tmp_path) == path
    ref = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").float().eval()
    assert type(ref).__name__ == dims.architecture
    tokens = torch.randint(0, dims.vocab_size, (2, 12))
    with torch.no_grad():
        ours = model(tokens)
        theirs = ref(input_ids=tokens).logits
    assert float((ours - theirs).norm() / theirs.norm()) < 1e-5


def test_load_restores_everything(tmp_path: Path) -> None:
    dims, model, opt, sched, path = _trained_and_saved(tmp_path, 3)
    fresh = LlamaModel(dims)
    fopt, fsched = make_adamw(fresh.parameters(), OptimizerSpec(lr=1e-2), 10)
    state, tensors, loaded = checkpoint.load(path)
    fresh.load_state_dict(tensors)
    fopt.load_state_dict(loaded["optimizer"])
    fsched.load_state_dict(loaded["schedule"])
    assert state == checkpoint.TrainerState(3, 3)
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), n
    assert fsched.last_epoch == sched.last_epoch
    assert fopt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    # No temp dirs left behind by the atomic write.
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_large_checkpoints_are_sharded_with_an_index(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(checkpoint, "SHARD_BYTES", 20_000)
    dims, model, _, _, path = _trained_and_saved(tmp_path, 1, "tiny-qwen3")
    index = (path / checkpoint.INDEX).read_text()
    assert len(list(path.glob("model-*-of-*.safetensors"))) > 1 and "weight_map" in index
    ref = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").float().eval()
    _, tensors, _ = checkpoint.load(path)
    assert set(tensors) == set(model.state_dict())
    tokens = torch.randint(0, dims.vocab_size, (2, 12))
    with torch.no_grad():
        assert torch.allclose(model(tokens), ref(input_ids=tokens).logits, atol=1e-5)


def _tiny_state() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(4096, dtype=torch.float32)}


def test_only_the_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    (root / ".tmp-crashed").mkdir(parents=True)  # a write a killed worker left behind
    for step in (10, 20, 30, 40):
        checkpoint.save(root, checkpoint.TrainerState(step, step), _tiny_state(), {}, {}, keep=2)
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "latest",
        "step-00000030",
        "step-00000040",
    ]
    assert checkpoint.latest(root) == root / "step-00000040"
    assert not list(root.glob(".tmp-*"))


def test_a_failed_write_leaves_the_previous_checkpoint_and_no_temp_files(tmp_path: Path) -> None:
    """A real write failure: the worker process may write at most 64 KiB per file
    (RLIMIT_FSIZE, the kernel's EFBIG, as a full disk's ENOSPC fails a write), so the second
    checkpoint, of 1 MiB, cannot be written."""
    import subprocess
    import sys

    code = f"""
import resource, signal, sys, torch
from pathlib import Path
from wstrain.worker.io import checkpoint
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG, not a kill
root = Path({str(tmp_path / "ckpt")!r})
checkpoint.save(root, checkpoint.TrainerState(1, 1), {{"w": torch.zeros(1024)}}, {{}}, {{}})
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
try:
    checkpoint.save(root, checkpoint.TrainerState(2, 2), {{"w": torch.zeros(1 << 18)}}, {{}}, {{}})
except OSError as exc:
    print(exc)
    sys.exit(7)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 7, res.stderr[-2000:]
    assert "checkpoint of step 2 not written" in res.stdout
    assert "step-00000001 stays valid" in res.stdout
    root = tmp_path / "ckpt"
    assert checkpoint.latest(root) == root / "step-00000001"
    assert not list(root.glob(".tmp-*"))
    state, tensors, _ = checkpoint.load(root / "step-00000001")
    assert state.step == 1 and tensors["w"].numel() == 1024
