"""Submission-time checks a JobSpec must pass beyond its schema: the model resolves, data
files exist under the configured data roots (outside the state dir) and fit the model, the
budgets fit some node (or the chip a plan is asked for: gpu_node), and a plan exists. Each
failure is an InvalidSpec/InfeasibleBudget naming its field (`detail['field']`) and the fix.

validate_and_plan runs every check whose inputs are valid and raises all their failures at
once: one as itself, several as SpecErrors (contracts/errors.py), which the API answers as
one 422 with an entry per field, like schema errors. A check that needs an earlier one's
result is skipped when that one failed: no vocabulary check without a model, no plan
without a model and a node.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from wstrain.api.data_checks import check_data_path, check_tokenizer
from wstrain.api.ranges import choose_point, range_points
from wstrain.contracts.access import DataAccess
from wstrain.contracts.calibration import GIB
from wstrain.contracts.chips import GpuName
from wstrain.contracts.errors import InfeasibleBudget, InvalidSpec, SpecErrors, WstrainError
from wstrain.contracts.hardware import DEFAULT_PROFILE, SHIPPED_PROFILES, NodeProfile
from wstrain.contracts.jobs import GPUInfo, Node
from wstrain.contracts.model_dims import ModelDims, resolve_dims
from wstrain.contracts.model_refs import HFConfigModel, PathModel
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec, TextData, TokenData
from wstrain.contracts.token_file import document_span
from wstrain.planning.planner import make_plan

# documents whose lengths price a document_mask job's attention on submit: 35 ms of Python
# on the dev VM, and on a million random lengths within 0.1% of the span of all of them,
# which the agent reads before the job runs (agent/launch.py)
SUBMIT_SPAN_DOCUMENTS = 1 << 16


def pick_node(spec: JobSpec, nodes: list[Node]) -> NodeProfile:
    """The node profile to plan with: the largest node that could hold the budgets."""
    if not nodes:
        return DEFAULT_PROFILE
    profiles = [
        NodeProfile.from_profile(
            n.device,
            n.profile,
            max((g.total_bytes for g in n.gpus), default=n.host_total_bytes),
            n.host_total_bytes,
        )
        for n in nodes
    ]
    fits = [
        p
        for p in profiles
        if p.device_total_bytes >= spec.budget.device_bytes
        and p.host_total_bytes >= spec.budget.host_bytes
    ]
    if not fits:
        dev = max(p.device_total_bytes for p in profiles) / GIB
        host = max(p.host_total_bytes for p in profiles) / GIB
        raise InvalidSpec(
            f"budget device_gib={spec.budget.device_gib}, host_gib={spec.budget.host_gib} is "
            f"larger than any node has (largest device {dev:.1f} GiB, largest host "
            f"{host:.1f} GiB); lower the budgets",
            field="budget",
        )
    return max(fits, key=lambda p: p.matmul_flops)


def gpu_node(spec: JobSpec, gpu: GpuName) -> tuple[Node, str]:
    """A node of `spec.gpus` `gpu`s with wstrain's shipped profile for that chip
    (contracts/hardware.py), to plan `spec` for a chip no node of the queue has (POST
    /v1/plans?gpu=), and the note the plan carries that says so. Its host is the profile's
    or the spec's host budget, whichever is larger: the chip is what is asked about. A
    ranged device budget is refused only when its min is more than the chip holds."""
    shipped = SHIPPED_PROFILES[gpu]
    (device_gib, _), (_, host_max_gib) = spec.budget.device_range_gib, spec.budget.host_range_gib
    if device_gib * GIB > shipped.device_total_bytes:  # a range: its min
        larger = [
            f"{name} ({p.device_total_bytes / GIB:.1f} GiB)"
            for name, p in SHIPPED_PROFILES.items()
            if p.device_total_bytes >= device_gib * GIB
        ]
        raise InvalidSpec(
            f"budget device_gib={device_gib:g} is more than one {shipped.label} "
            f"holds ({shipped.device_total_bytes / GIB:.1f} GiB); lower it"
            + (f", or plan for a larger chip: --gpu {', '.join(larger)}" if larger else ""),
            field="budget",
        )
    host_bytes = max(shipped.host_total_bytes, int(host_max_gib * GIB))
    gpus = [
        GPUInfo(
            index=i,
            name=shipped.label,
            total_bytes=shipped.device_total_bytes,
            free_bytes=shipped.device_total_bytes,
        )
        for i in range(spec.gpus)
    ]
    node = Node(
        name=f"gpu:{gpu}",
        device="cuda",
        gpus=gpus,
        host_total_bytes=host_bytes,
        host_free_bytes=host_bytes,
        slots=spec.gpus,
        running=[],
        profile=dict(shipped.profile),
        heartbeat_at=0.0,
    )
    return node, shipped.note


T = TypeVar("T")


class _Checks:
    """Runs a spec's independent checks, keeping each one's failure, each named by its field
    (the one the check is about, unless the error names another), so that one answer lists
    them all."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.failures: list[WstrainError] = []

    def run(self, field: str, check: Callable[[], T]) -> T | None:
        """What `check` returns, or None when it failed (its failure kept)."""
        try:
            return check()
        except (InvalidSpec, InfeasibleBudget) as exc:
            # a budget too small for the model is the budget's fault, whichever check found it
            at = "budget" if isinstance(exc, InfeasibleBudget) else field
            exc.detail.setdefault("field", at)
            self.failures.append(exc)
            return None

    def raise_failures(self) -> None:
        """Raise what failed: one failure as itself (its status and body as ever), several
        as one SpecErrors."""
        if len(self.failures) == 1:
            raise self.failures[0]
        if self.failures:
            spec = self.spec.model_dump(mode="json")
            fields = [str(e.detail["field"]) for e in self.failures]
            raise SpecErrors.of(self.failures, [_value_at(spec, f) for f in fields])


def _value_at(spec: dict[str, object], field: str) -> object:
    """The value at dotted `field` of the spec's JSON (None where it has none)."""
    value: object = spec
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _model_field(spec: JobSpec) -> str:
    if isinstance(spec.model, PathModel):
        return "model.path"
    return "model.hf_config" if isinstance(spec.model, HFConfigModel) else "model.preset"


def _resolve_model(spec: JobSpec, access: DataAccess) -> ModelDims:
    """The model's dimensions; a model directory must hold weights to fine-tune too."""
    if isinstance(spec.model, PathModel):  # the directory opened and checked, then listed
        with access.descriptor(spec.model.path, "model.path", directory=True) as fd:
            weights = any(name.endswith(".safetensors") for name in os.listdir(fd))
        if not weights:
            raise InvalidSpec(
                f"model.path={spec.model.path!r} holds no *.safetensors weights "
                "to fine-tune; save the model with save_pretrained (safetensors), "
                'or name {"hf_config": ...} to train from scratch'
            )
    return resolve_dims(spec.model, access)  # config.json by descriptor, capped


def _with_documents(
    spec: JobSpec, data: TokenData, node: NodeProfile, access: DataAccess
) -> NodeProfile:
    """`node` pricing long sequences' pieces at their documents' attention span."""
    try:  # the index by descriptor, under a root too
        span = document_span(data.path, spec.seq_len, SUBMIT_SPAN_DOCUMENTS, access)
    except OSError as exc:
        raise InvalidSpec(
            f"data.path={data.path!r}: its document index cannot be read "
            f"({exc.strerror}); "
            "prepare the file again with `wstrain prepare`, or set document_mask: false"
        ) from exc
    return node.with_documents(span)


def validate_and_plan(spec: JobSpec, nodes: list[Node], access: DataAccess) -> Plan:
    """The plan for `spec` on the largest node of `nodes` that holds its budgets, once every
    check passed; otherwise every failure at once (see the module's docstring). A ranged
    budget is planned at the point choose_point picks, and its plan lists a few points of
    the range, each planned (Plan.range_points)."""
    checks = _Checks(spec)
    dims = checks.run(_model_field(spec), lambda: _resolve_model(spec, access))
    data_ok = checks.run("data.path", lambda: check_data_path(spec, dims, access))
    if isinstance(spec.data, TextData):
        text = spec.data
        checks.run("data.tokenizer", lambda: check_tokenizer(text, dims, access))
    # a ranged budget is planned at one point of it (api/ranges.py), which the plan records
    point = checks.run("budget", lambda: choose_point(spec, nodes))
    at = spec.at_budget(*point) if point is not None else None
    node = checks.run("budget", lambda: pick_node(at, nodes)) if at is not None else None
    if node is not None and spec.document_mask and isinstance(spec.data, TokenData):
        # long sequences' pieces cost their documents: the span reads the index data.path's
        # check vouched for, so without that check's pass there is no price and no plan
        tokens, priced = spec.data, node
        node = (
            checks.run("data.path", lambda: _with_documents(spec, tokens, priced, access))
            if data_ok
            else None
        )
    plan = None
    if dims is not None and node is not None and at is not None:  # a refusal names the
        known = at, dims, node  # budget or an override
        plan = checks.run("overrides", lambda: _plan(*known))
    checks.raise_failures()
    assert plan is not None, "no failure kept, so every check ran and planning passed"
    if spec.budget.ranged and dims is not None and node is not None:
        where = dims, node
        plan.range_points = range_points(spec, node, lambda s: _plan(s, *where))
    return plan


# Plans already made, by (spec less its name, node profile): a sweep of jobs that differ in
# name only plans once. Planning is 10-75 ms of CPU a spec; under bench/api_load.py's mix it
# was a quarter of the API's CPU, for a tenth of the requests. In the API each planner
# process (api/planning.py) keeps its own: the last process to finish plans next, so one
# owner's sweep, which plans one spec at a time, stays on the process that holds its plan.
_PLANS: OrderedDict[tuple[str, NodeProfile], Plan] = OrderedDict()
_PLANS_MAX = 256
_PLANS_LOCK = threading.Lock()  # callers outside the API (tests, bench/) plan in threads


def _plan(spec: JobSpec, dims: ModelDims, node: NodeProfile) -> Plan:
    key = (spec.model_dump_json(exclude={"name"}), node)
    with _PLANS_LOCK:
        cached = _PLANS.get(key)
        if cached is not None:
            _PLANS.move_to_end(key)
            return cached.model_copy(deep=True)  # the caller may annotate its copy
    plan = make_plan(spec, dims, node)  # a refusal (InfeasibleBudget) raises, uncached
    with _PLANS_LOCK:
        _PLANS[key] = plan.model_copy(deep=True)
        while len(_PLANS) > _PLANS_MAX:
            _PLANS.popitem(last=False)
    return plan
