"""The data order end to end: a token file made by `wstrain prepare`, trained through the
service with a cancel and a resume in the middle of an epoch, visits every sequence of each
epoch exactly once, in the documented order (docs/DESIGN.md, "The data order").

How the order is checked from outside the worker: every document is `seq_len` bytes that all
start with "#", so each sequence of the prepared file is one document plus its end-of-text
byte, and the target of any sequence's last input is "#" whichever sequence follows. A second
file lays the sequences out in the order docs/DESIGN.md documents — the permutation
numpy.random.default_rng([seed, epoch]).permutation(n) for epoch 0, 1, 2 — and a job on it
with `shuffle: false` must end with the same weights, bit for bit, as the shuffled job on the
prepared file: true only if that job trained every sequence in exactly that order.

    pytest -m slow tests/e2e/test_data_order.py
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, Stack, tiny_spec, wait_job, wait_terminal
from tests.helpers.jobs import checkpoint_weights

pytestmark = pytest.mark.slow

SEQ, BATCH, SEED, SEQUENCES = 32, 4, 5, 53
STEPS = 400  # 1600 sequences: 30.2 epochs; every 53rd step ends on an epoch boundary
EPOCHS = -(-STEPS * BATCH // SEQUENCES)


def _prepared(data_dir: Path) -> Path:
    """SEQUENCES documents of SEQ-1 bytes, each "#..." (and one more for the last target),
    through `wstrain prepare` with the byte tokenizer."""
    rng = random.Random(0)
    lines = [
        json.dumps({"text": "#" + "".join(rng.choice("abcdefgh ") for _ in range(SEQ - 2))})
        for _ in range(SEQUENCES + 1)
    ]
    (data_dir / "docs.jsonl").write_text("\n".join(lines) + "\n")
    out = data_dir / "docs.bin"
    subprocess.run(
        [sys.executable, "-m", "wstrain.cli.main", "prepare", str(data_dir / "docs.jsonl"),
         str(out), "--chunk-mib", "1"],
        check=True, cwd=REPO,
    )  # fmt: skip
    header = json.loads(out.with_suffix(".json").read_text())
    assert header["complete"] and header["tokens"] == (SEQUENCES + 1) * SEQ
    return out


def _in_documented_order(prepared: Path, epochs: int) -> Path:
    tokens = np.fromfile(prepared, np.uint16)
    seqs = tokens[: SEQUENCES * SEQ].reshape(SEQUENCES, SEQ)
    assert (seqs[:, 0] == ord("#")).all()
    order = [np.random.default_rng([SEED, e]).permutation(SEQUENCES) for e in range(epochs)]
    laid_out = np.concatenate([seqs[np.concatenate(order)].reshape(-1), [ord("#")]])
    path = prepared.with_name("documented-order.bin")
    laid_out.astype(np.uint16).tofile(path)
    return path


def test_each_epoch_visits_every_sequence_once_in_order_across_a_cancel(stack: Stack) -> None:
    data_dir = stack.state_dir.parent / "data-order"
    data_dir.mkdir(exist_ok=True)
    prepared = _prepared(data_dir)
    documented = _in_documented_order(prepared, EPOCHS)
    common = dict(seq_len=SEQ, global_batch=BATCH, steps=STEPS, seed=SEED)
    token_file = {"kind": "tokens", "path": str(prepared)}
    with stack.client() as c:
        straight = c.post(
            "/v1/jobs",
            json=tiny_spec(
                "order-by-hand", data={"kind": "tokens", "path": str(documented),
                                       "dtype": "uint16"}, shuffle=False, **common
            ),
        ).json()  # fmt: skip
        cut = c.post("/v1/jobs", json=tiny_spec("order-cut", data=token_file, **common)).json()
        inside_an_epoch = False
        for _ in range(3):  # a cancel that lands on an epoch boundary (1 in 53) goes again
            step = wait_job(c, cut["id"], lambda j: j["state"] == "running")["step"]
            wait_job(c, cut["id"], lambda j, s=step: j["step"] >= s + 20)
            assert c.post(f"/v1/jobs/{cut['id']}/cancel").status_code == 202
            cancelled = wait_terminal(c, cut["id"])
            assert cancelled["state"] == "cancelled", "the cancel must land mid-run"
            stopped_at = cancelled["step"]
            assert cancelled["data_position"] == stopped_at * BATCH
            assert cancelled["epoch"] == pytest.approx(stopped_at * BATCH / SEQUENCES)
            assert c.post(f"/v1/jobs/{cut['id']}/resume").status_code == 202
            if stopped_at * BATCH % SEQUENCES:
                inside_an_epoch = True
                break
        assert inside_an_epoch
        done = wait_terminal(c, cut["id"])
        straight = wait_terminal(c, straight["id"])
    assert done["state"] == straight["state"] == "succeeded", (done["error"], straight["error"])
    assert done["epoch"] == pytest.approx(STEPS * BATCH / SEQUENCES)
    assert done["tokens_seen"] == STEPS * BATCH * SEQ
    assert done["data_position"] == STEPS * BATCH
    resumed, by_hand = checkpoint_weights(done), checkpoint_weights(straight)
    assert resumed.keys() == by_hand.keys()
    for name, w in resumed.items():
        assert w.equal(by_hand[name]), f"{name}: the shuffled, resumed job trained another order"
