"""A job on several nodes through the worker process (worker/ranks.py NodeOf, worker/main.py)
on CPU with gloo over loopback: two workers started as the agents of two nodes start them
(NNODES=2, NODE_RANK, MASTER_ADDR, MASTER_PORT), each with 2 "GPUs" (its node's local ranks
1..gpus-1 as its children, its own shm dir: its node's host copy), train the one-rank job to
the same weights (fp32, 1e-5); only node 0's worker reports and writes checkpoints, and
node 1's exits 0 with it. The launch environment: global rank NODE_RANK x gpus + local.

    pytest tests/worker/test_nodes.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import tiny_spec
from tests.ports import free_port
from tests.worker.forked import ForkedWorker, spawn
from tests.worker.launch import (
    assert_close,
    finish,
    last_weights,
    start,
    tiny_job_dir,
    worker_argv,
    write_job,
)
from wstrain.contracts.hardware import DEFAULT_PROFILE
from wstrain.contracts.jobs import WorkerExit
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.spec import JobSpec
from wstrain.planning.planner import make_plan
from wstrain.worker.ranks import NodeOf, torchrun_env

STEPS = 6


def test_the_launch_env_numbers_ranks_across_nodes() -> None:
    node = NodeOf(nodes=3, node_rank=2, master_addr="10.0.0.5", master_port=29500)
    env = torchrun_env(1, 4, 0, node)
    assert env == {
        "RANK": "9",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "12",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
    }


def test_a_node_rank_outside_the_nodes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=r"NODE_RANK=2 is outside 0\.\.NNODES-1"):
        NodeOf.from_env()


def _two_node_dir(tmp_path: Path) -> Path:
    spec = JobSpec.model_validate(
        tiny_spec(
            "mn",
            steps=STEPS,
            gpus=2,
            nodes=2,
            checkpoint_every=2,
            overrides={"runtime": "working_set", "micro_batch": 1},
        )
    )
    plan = make_plan(spec, resolve_dims(spec.model), DEFAULT_PROFILE)
    assert plan.ranks == 2 and plan.nodes == 2 and plan.rounds == 1
    return write_job(tmp_path / "mn", spec, plan)


def _start_node(job_dir: Path, node_rank: int, port: int) -> ForkedWorker:
    shm = job_dir.parent / f"shm-{node_rank}"  # each node its own host copy
    shm.mkdir()
    env = {
        **os.environ,
        "NNODES": "2",
        "NODE_RANK": str(node_rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    with open(job_dir / f"worker-node{node_rank}.log", "w") as log:
        return spawn(worker_argv(job_dir, "--shm-dir", str(shm)), stderr=log, env=env)


def test_two_nodes_of_two_ranks_train_the_one_rank_job(tmp_path: Path) -> None:
    one, two = tiny_job_dir(tmp_path, 1, "working_set"), _two_node_dir(tmp_path)
    port = free_port()
    procs = [start(one), _start_node(two, 0, port), _start_node(two, 1, port)]
    (c1, _), (c0, msgs0), (cn1, msgs1) = (finish(p) for p in procs)
    logs = "".join((two / f"worker-node{i}.log").read_text()[-2000:] for i in (0, 1))
    assert c1 == c0 == cn1 == WorkerExit.succeeded, logs
    assert sum(m.kind == "started" for m in msgs0) == 1 and not msgs1  # node 0 alone reports
    assert [m.step for m in msgs0 if m.kind == "checkpoint"] == [2, 4, STEPS]
    assert_close(last_weights(two), last_weights(one))
