"""A two-GPU job through the worker process on NCCL (worker/ranks.py): on a machine with two
or more GPUs, `python -m wstrain.worker.main` of a 2-GPU working-set plan (one shared host
copy, page-locked in both ranks) trains the one-GPU job to the same losses and weights
within GPU reduction-order noise (fp32). Skips without two GPUs.

    pytest tests/worker/test_ranks_gpu.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_spec
from tests.worker.launch import finish, last_weights, start, write_job
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import WorkerExit
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]


@pytest.mark.parametrize("runtime", ["working_set", "resident"])
def test_a_two_gpu_job_on_nccl_trains_the_one_gpu_job(tmp_path: Path, runtime: str) -> None:
    dirs = []
    for gpus in (1, 2):
        spec = JobSpec.model_validate(
            tiny_spec(
                f"nccl{gpus}",
                steps=6,
                gpus=gpus,
                budget={"device_gib": 8, "host_gib": 16},
                overrides={"runtime": runtime, "device": "cuda", "micro_batch": 1},
            )
        )
        plan = make_plan(spec, resolve_dims(spec.model), DEFAULT_PROFILE)
        assert plan.ranks == gpus
        dirs.append(write_job(tmp_path / f"g{gpus}", spec, plan))
    results = [finish(start(d)) for d in dirs]  # one at a time: both GPUs for the gang
    for (code, _), d in zip(results, dirs):
        assert code == WorkerExit.succeeded, (d / "worker.log").read_text()[-3000:]
    losses = [[m.loss for m in msgs if m.kind == "step"][-1] for _, msgs in results]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    one, two = last_weights(dirs[0]), last_weights(dirs[1])
    for name, w in one.items():
        err = float((two[name] - w).norm() / w.norm().clamp_min(1e-30))
        assert err < 1e-3, (name, err)
    assert "rank 0 of 2: started ranks" in (dirs[1] / "worker.log").read_text()
