"""What a job left behind, read back through the API and its checkpoint: the weights at its
last checkpoint, and the states it went through (the event log, oldest first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from safetensors.torch import load_file


def checkpoint_weights(job: dict[str, Any]) -> dict[str, Any]:
    """The tensors of `job`'s last checkpoint, by parameter name."""
    return load_file(Path(job["last_checkpoint"]) / "model.safetensors")


def assert_same_weights(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Jobs `a` and `b` ended with bit-identical weights (same names, every tensor equal)."""
    a_w, b_w = checkpoint_weights(a), checkpoint_weights(b)
    assert a_w.keys() == b_w.keys()
    for name in a_w:
        assert a_w[name].equal(b_w[name]), f"{name} differs from the uninterrupted run"


def job_states(c: httpx.Client, job_id: str) -> list[str]:
    """Every state the job entered, in order, from its first 1000 events."""
    events = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()
    return [e["data"]["state"] for e in events if e["kind"] == "state"]
