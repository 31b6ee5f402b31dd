"""Each derived value has one source: the plan a job launches with is the one make_plan gave
on submission for the same inputs, not planned a second time (counted); the host arena's
limit is calibration.host_arena_limit_bytes wherever a worker builds its arena; a sequence's
pieces, their spans and a step's tokens are contracts/step_shape.py's, and both runtimes
read the sequence length from their config. A grep over src/ and bench/ keeps the
formulas from coming back.

    pytest tests/planning/test_derived_once.py
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from typing import Any

import pytest

from tests.conftest import REPO, tiny_spec
from wstrain.api.validation import validate_and_plan
from wstrain.contracts.access import DataAccess
from wstrain.contracts.calibration import GIB, host_arena_limit_bytes, host_reserve_bytes
from wstrain.contracts.hardware import DEFAULT_PROFILE, LayerTimes, NodeProfile
from wstrain.contracts.jobs import Node
from wstrain.contracts.model_dims import ModelDims, resolve_dims
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec
from wstrain.contracts.step_shape import piece_count, piece_spans, step_tokens
from wstrain.planning import planner
from wstrain.planning.layouts import seq_chunks

SRC = REPO / "src" / "wstrain"
BENCH = REPO / "bench"
ACCESS = DataAccess.of([REPO], None)
HOST_BYTES = 64 * GIB


def _spec(**over: Any) -> JobSpec:
    return JobSpec.model_validate(tiny_spec("once", **over))


def _cpu_node(name: str = "node-a", matmul_flops: float = 3.1e11) -> Node:
    """A CPU agent's node record as it registers it (agent/agent.py Agent.node)."""
    return Node(
        name=name,
        device="cpu",
        gpus=[],
        host_total_bytes=HOST_BYTES,
        host_free_bytes=HOST_BYTES,
        slots=2,
        running=[],
        profile={"matmul_flops": matmul_flops, "optimizer_params_per_s": 2.5e8},
        heartbeat_at=0.0,
    )


def _agent_view(node: Node, layer: LayerTimes | None = None, link_share: int = 1) -> NodeProfile:
    """The node as agent/launch.py plans a claimed job on it: its measured profile, its
    largest device (host memory on a CPU node), the job's layer and GPU share, its
    documents (none here: no document_mask)."""
    device_bytes = max((g.total_bytes for g in node.gpus), default=node.host_total_bytes)
    profile = NodeProfile.from_profile(
        node.device, node.profile, device_bytes, node.host_total_bytes
    )
    return profile.with_layer(layer).shared_by(link_share).with_documents(0)


@pytest.fixture
def make_plan_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every make_plan call launch_plan makes, recorded; planning still runs."""
    calls: list[tuple[Any, ...]] = []
    real = planner.make_plan

    def counted(*args: Any) -> Plan:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(planner, "make_plan", counted)
    return calls


def _stored(plan: Plan) -> Plan:
    """The plan as the store keeps it with the job and the agent reads it back (JSON)."""
    return Plan.model_validate_json(plan.model_dump_json())


# ------------------------------------------------------------------ the plan, once


def test_the_agent_launches_the_submitted_plan_without_planning_again(
    make_plan_calls: list[tuple[Any, ...]],
) -> None:
    spec, node = _spec(), _cpu_node()
    submitted = _stored(validate_and_plan(spec, [node], ACCESS))  # the API, on submission
    assert submitted.inputs_digest
    dims = resolve_dims(spec.model, ACCESS)
    launched = planner.launch_plan(submitted, spec, dims, _agent_view(node))
    assert make_plan_calls == []  # the plan made on submission, not a second one
    assert launched is submitted
    # the name is not an input: a sweep's jobs that differ by name launch their own plans
    renamed = spec.model_copy(update={"name": "once-again"})
    assert planner.launch_plan(submitted, renamed, dims, _agent_view(node)) is submitted
    assert make_plan_calls == []


def test_the_submitted_plan_equals_the_plan_made_again_for_the_same_node() -> None:
    spec, node = _spec(), _cpu_node()
    submitted = _stored(validate_and_plan(spec, [node], ACCESS))
    again = planner.make_plan(spec, resolve_dims(spec.model, ACCESS), _agent_view(node))
    assert again == submitted  # so launching the stored one changes nothing for the user


@pytest.mark.parametrize(
    "differs",
    ["layer measured", "shared GPU", "resumed runtime", "another node", "another model"],
)
def test_a_node_unlike_the_submitted_one_plans_again_through_make_plan(
    make_plan_calls: list[tuple[Any, ...]], differs: str
) -> None:
    spec, node = _spec(), _cpu_node()
    submitted = _stored(validate_and_plan(spec, [node], ACCESS))
    dims = resolve_dims(spec.model, ACCESS)
    view, resumes = _agent_view(node), None
    if differs == "layer measured":
        view = _agent_view(node, LayerTimes(spec.seq_len, 1e-4, 2e-4, 3e-5, 6e-5))
    elif differs == "shared GPU":
        view = _agent_view(node, link_share=2)
    elif differs == "resumed runtime":
        resumes = submitted.runtime
    elif differs == "another node":
        view = _agent_view(_cpu_node("node-b", matmul_flops=1.7e11))
    else:  # the model's config changed between submission and launch
        dims = replace(dims, intermediate_size=dims.intermediate_size * 2)
    launched = planner.launch_plan(submitted, spec, dims, view, resumes)
    assert len(make_plan_calls) == 1
    made = make_plan_calls[0]
    assert made[:3] == (spec, dims, view)
    assert launched.inputs_digest == planner.plan_inputs_digest(spec, dims, view, resumes)
    assert launched.inputs_digest != submitted.inputs_digest


def test_a_job_stored_without_a_digest_plans_again(
    make_plan_calls: list[tuple[Any, ...]],
) -> None:
    """A plan stored before plans carried their inputs' digest is planned again."""
    spec, node = _spec(), _cpu_node()
    submitted = _stored(validate_and_plan(spec, [node], ACCESS))
    older = submitted.model_copy(update={"inputs_digest": ""})
    dims = resolve_dims(spec.model, ACCESS)
    assert planner.launch_plan(older, spec, dims, _agent_view(node)) == submitted
    assert planner.launch_plan(None, spec, dims, _agent_view(node)) == submitted
    assert len(make_plan_calls) == 2


# ------------------------------------------------------------------ the host arena's limit


def _ws_spec(host_gib: float) -> tuple[JobSpec, ModelDims, Plan]:
    spec = _spec(
        model={"preset": "tiny-llama"},
        budget={"device_gib": 1, "host_gib": host_gib},
        overrides={"runtime": "working_set"},
    )
    dims = resolve_dims(spec.model, ACCESS)
    return spec, dims, planner.make_plan(spec, dims, DEFAULT_PROFILE)


def test_the_worker_caps_its_arena_at_the_one_limit() -> None:
    from wstrain.worker.build import build_runtime  # torch: only for this test

    spec, dims, plan = _ws_spec(2)
    runtime = build_runtime(spec, plan, ACCESS)
    limit = runtime.host.arena.limit_bytes  # type: ignore[attr-defined]
    want = host_arena_limit_bytes(spec.budget.host_bytes, dims.params, spec.precision, "cpu")
    assert (
        limit
        == want
        == spec.budget.host_bytes - host_reserve_bytes(dims.params, spec.precision, "cpu")
    )
    assert runtime.host.arena.total_bytes <= limit  # type: ignore[attr-defined]


@pytest.mark.parametrize("host_gib", [1.5, 2, 8])
def test_a_one_rank_plan_fits_its_arena_under_the_limit(host_gib: float) -> None:
    """The planner counts the reserve the limit leaves out: the host bytes a plan predicts,
    less that reserve, are what its arena may hold."""
    spec, dims, plan = _ws_spec(host_gib)
    reserve = host_reserve_bytes(dims.params, spec.precision, plan.device)
    limit = host_arena_limit_bytes(spec.budget.host_bytes, dims.params, spec.precision, "cpu")
    assert plan.predicted.peak_host_bytes - reserve <= limit


# ------------------------------------------------------------------ pieces and tokens


@pytest.mark.parametrize(
    ("seq_len", "seq_chunk", "count"),
    [(32768, 0, 1), (32768, 8192, 4), (32768, 32768, 1), (32768, 65536, 1), (10, 4, 3)],
)
def test_pieces_and_their_spans(seq_len: int, seq_chunk: int, count: int) -> None:
    spans = piece_spans(seq_len, seq_chunk)
    assert piece_count(seq_len, seq_chunk) == count == len(spans)
    assert spans[0][0] == 0 and spans[-1][1] == seq_len
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_the_planner_and_the_runtime_cut_sequences_alike() -> None:
    from wstrain.worker.runtime.working_set.config import WorkingSetConfig

    spec = _spec(model={"preset": "tiny-llama"}, seq_len=65536, global_batch=1)
    dims = resolve_dims(spec.model, ACCESS)
    options = seq_chunks(spec, dims)
    assert (0, 1) in options and len(options) > 1
    for seq_chunk, pieces in options:
        cfg = WorkingSetConfig("bf16", "cpu", 1, 1, 1, 1, 0, spec.seq_len, seq_chunk=seq_chunk)
        assert cfg.pieces == pieces and cfg.spans() == piece_spans(spec.seq_len, seq_chunk)


def test_both_runtimes_read_the_sequence_length_from_their_config() -> None:
    from wstrain.worker.build import build_runtime, ws_config

    spec = _spec(model={"preset": "tiny-llama"})
    dims = resolve_dims(spec.model, ACCESS)
    resident = planner.make_plan(
        spec.model_copy(
            update={"overrides": spec.overrides.model_copy(update={"runtime": "resident"})}
        ),
        dims,
        DEFAULT_PROFILE,
    )
    runtime = build_runtime(spec, resident, ACCESS)
    assert runtime.cfg.seq_len == spec.seq_len  # type: ignore[attr-defined]
    _, _, ws_plan = _ws_spec(2)
    assert ws_config(spec, ws_plan).seq_len == spec.seq_len
    assert step_tokens(spec.global_batch, spec.seq_len) == spec.global_batch * spec.seq_len


# ------------------------------------------------------------------ the formulas, once

# (pattern, the only files under src/ and bench/ allowed to hold it)
ONCE = [
    # the arena's limit: the host budget less the reserve
    (r"host_bytes\s*-\s*host_reserve_bytes", {"contracts/calibration.py"}),
    # a sequence's pieces, by ceiling division, and their spans
    (r"-\(-\s*[\w.]*seq_len\s*//", {"contracts/step_shape.py"}),
    (r"range\(0,\s*[\w.]*seq_len,", {"contracts/step_shape.py"}),
    # the resident runtime's tokens from the data rather than its config
    (r"data\.seq_len", {"worker/runtime/distributed.py"}),
    # a step's tokens by hand in the runtimes and the worker
    # (a square of seq_len, such as the document mask's pairs, is not a token count)
    (r"(micro|global)_batch\s*\*\s*[\w.]*seq_len\b(?!\s*\*\*)", set()),
]


def _sources() -> list[tuple[str, str]]:
    files = [*SRC.rglob("*.py")]
    return [(str(p.relative_to(SRC)), p.read_text()) for p in files]


@pytest.mark.parametrize(("pattern", "allowed"), ONCE)
def test_each_formula_is_written_once_in_src(pattern: str, allowed: set[str]) -> None:
    found = {name for name, text in _sources() if re.search(pattern, text)}
    assert found <= allowed, f"{sorted(found - allowed)} derive {pattern!r} again"


def test_bench_builds_its_arena_with_the_one_limit() -> None:
    texts = {p.name: p.read_text() for p in BENCH.rglob("*.py")}
    assert any("host_arena_limit_bytes(" in text for text in texts.values())
    again = [n for n, t in texts.items() if re.search(r"host_bytes\s*-\s*host_reserve_bytes", t)]
    assert again == []
