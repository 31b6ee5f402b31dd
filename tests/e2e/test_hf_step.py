"""One step through the service on a Hugging Face Llama directory and a prepared token file
with `shuffle: false` equals the same step in transformers: the same model, the first
`global_batch` sequences of the file, torch's AdamW with the job's settings and global-norm
clipping. The job's reported loss and the weights of its checkpoint are compared.

    pytest -m slow tests/e2e/test_hf_step.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.conftest import CORPUS, REPO, Stack, tiny_spec, wait_terminal
from tests.worker.hf_models import hf_causal_lm, hub_state, perturb_norms
from wstrain.contracts.model_dims import PRESETS

pytestmark = pytest.mark.slow

SEQ, BATCH = 32, 4
OPTIMIZER = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
             "grad_clip": 0.5, "schedule": "constant"}  # fmt: skip


def _token_file(data_dir: Path) -> Path:
    paragraphs = [p for p in CORPUS.read_text().split("\n\n") if p.strip()][:40]
    (data_dir / "docs.jsonl").write_text(
        "".join(json.dumps({"text": p}) + "\n" for p in paragraphs)
    )
    out = data_dir / "docs.bin"
    subprocess.run(
        [sys.executable, "-m", "wstrain.cli.main", "prepare", str(data_dir / "docs.jsonl"),
         str(out)],
        check=True, cwd=REPO,
    )  # fmt: skip
    return out


@dataclass(frozen=True)
class HfStep:
    """A Hugging Face Llama directory, a prepared token file, and transformers' first step
    on them: the loss, and the weights before and after (Hub names)."""

    model_dir: Path
    tokens: Path
    loss: float
    before: dict[str, torch.Tensor]
    after: dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def hf_step(stack: Stack) -> HfStep:
    """Built once for both runtimes: the model, the token file (a `wstrain prepare`
    subprocess) and the reference step are the same for each. Under the stack's folder,
    one of its agent's data roots."""
    data_dir = stack.state_dir.parent / "hf-step"
    data_dir.mkdir(exist_ok=True)
    torch.manual_seed(3)
    hf = hf_causal_lm(PRESETS["micro-llama"], "sdpa")
    perturb_norms(hf, seed=4)
    hf.save_pretrained(data_dir / "model", safe_serialization=True)
    tokens = _token_file(data_dir)

    # transformers: the file's first BATCH sequences, in file order
    ids = torch.from_numpy(np.fromfile(tokens, np.uint16)[: BATCH * SEQ + 1].astype(np.int64))
    inputs = torch.stack([ids[i * SEQ : (i + 1) * SEQ] for i in range(BATCH)])
    targets = torch.stack([ids[i * SEQ + 1 : (i + 1) * SEQ + 1] for i in range(BATCH)])
    before = {k: v.clone() for k, v in hub_state(hf).items()}
    logits = hf(input_ids=inputs).logits  # (B, S, V)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(hf.parameters(), OPTIMIZER["grad_clip"])
    opt = torch.optim.AdamW(
        hf.parameters(), lr=OPTIMIZER["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1
    )
    opt.step()
    after = {k: v.detach().clone() for k, v in hub_state(hf).items()}
    return HfStep(data_dir / "model", tokens, loss.item(), before, after)


@pytest.mark.parametrize("runtime", ["resident", "working_set"])
def test_one_step_on_a_hf_directory_equals_transformers(
    stack: Stack, hf_step: HfStep, runtime: str
) -> None:
    spec = tiny_spec(
        f"hf-step-{runtime}",
        model={"path": str(hf_step.model_dir)},
        data={"kind": "tokens", "path": str(hf_step.tokens)},
        shuffle=False,
        seq_len=SEQ,
        global_batch=BATCH,
        steps=1,
        optimizer=OPTIMIZER,
        overrides={"runtime": runtime, "micro_batch": 2},
    )
    with stack.client() as c:
        job = c.post("/v1/jobs", json=spec).json()
        assert job["plan"]["runtime"] == runtime, job
        done = wait_terminal(c, job["id"])
    assert done["state"] == "succeeded", done["error"]

    before, after = hf_step.before, hf_step.after
    assert done["loss"] == pytest.approx(hf_step.loss, rel=1e-5)
    trained = load_file(Path(done["last_checkpoint"]) / "model.safetensors")
    assert trained.keys() == after.keys()
    for name, w in trained.items():
        want, got = after[name] - before[name], w.float() - before[name]
        # AdamW's first step moves each weight by ~lr * sign(grad): a gradient within fp32
        # rounding of zero may flip its element's sign, so the update is compared as a whole
        err = ((got - want).norm() / want.norm()).item()
        assert err <= 1e-4, f"{name}: the update differs by {err:.2e} relative"
