"""The agent's layer timing reads no file a user named: it is handed the dims the agent read
through the data access, so a model path swapped for a link into the state dir (or a FIFO)
after submission cannot be read by the timing process. Runs the real timing subprocess on the
CPU with a one-layer model.

    pytest tests/agent/test_layer_times.py
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from tests.conftest import tiny_spec
from wstrain.agent.hardware import layer_times
from wstrain.contracts.model_dims import ModelDims, resolve_dims
from wstrain.contracts.spec import JobSpec

TINY = {
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
}


def test_layer_times_use_the_agents_dims_never_the_models_path(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(TINY))
    spec = JobSpec.model_validate(tiny_spec("layer", model={"path": str(model_dir)}))
    dims = resolve_dims(spec.model)
    assert isinstance(dims, ModelDims)
    jdir = tmp_path / "job"
    jdir.mkdir()
    (jdir / "spec.json").write_text(spec.model_dump_json())
    # after the agent read it, the model's config becomes a FIFO: opening it would block
    (model_dir / "config.json").unlink()
    os.mkfifo(model_dir / "config.json")
    times = asyncio.run(
        asyncio.wait_for(layer_times(tmp_path / "state", "cpu", spec, dims, jdir, 0), 120)
    )
    assert times is not None, "the timing process failed"
    assert times.forward_s > 0 and times.backward_s > 0
    assert json.loads((jdir / "dims.json").read_text())["hidden_size"] == 16
