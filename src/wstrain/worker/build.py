"""What the worker process builds from a job's spec and plan: the runtime the plan names
(`build_runtime`, with `ws_config` for a working-set plan) and the peak the job's MFU divides
by (`mfu_peak`). worker/main.py drives them; benchmarks and tests build runtimes the same way.

    runtime = build_runtime(spec, plan)  # resident or working set, from the spec's seed
    pytest tests/worker/test_main.py tests/worker/io/test_hf_load.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from wstrain.contracts.access import DataAccess
from wstrain.contracts.calibration import host_arena_limit_bytes
from wstrain.contracts.chips import ComputePrecision, peak_flops
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.model_refs import PathModel
from wstrain.contracts.plan import Plan, at_plan_budget
from wstrain.contracts.spec import JobSpec
from wstrain.worker.io.hf_load import stream_into
from wstrain.worker.models.initial import initial_weights
from wstrain.worker.runtime.base import Runtime
from wstrain.worker.runtime.distributed import ProcessGroup
from wstrain.worker.runtime.resident import ResidentRuntime, RuntimeConfig
from wstrain.worker.runtime.working_set.config import WorkingSetConfig
from wstrain.worker.runtime.working_set.node_share import NodeShare
from wstrain.worker.runtime.working_set.schedule import WorkingSetRuntime
from wstrain.worker.runtime.working_set.state import HostState

# Fault injection for tests only (tests/e2e/test_ranged_jobs.py, docs/OPERATIONS.md): the
# host arena's limit lowered by this many bytes, as a plan that under-counted host memory by
# as much would leave it, so a real worker runs out of its budget; unset in service
FAULT_HOST_SHORTFALL_ENV = "WSTRAIN_FAULT_HOST_SHORTFALL_BYTES"


def build_runtime(
    spec: JobSpec,
    plan: Plan,
    access: DataAccess | None = None,
    group: ProcessGroup | None = None,
    shm_dir: Path = Path("/dev/shm"),
    spill_dir: Path | None = None,
) -> Runtime:
    """The runtime the plan names, initialised from the spec's seed, or from the weights of
    the Hugging Face directory the spec's model names (read through `access`). With
    `group`, this rank's: a working set shares one host copy through `shm_dir` (tmpfs),
    which rank 0 fills while the others wait. The host arena is capped at the host budget
    the plan was made for (a ranged budget's point); a plan that spills layers keeps their
    AdamW moments in `spill_dir` (default: a temp dir), its file capped at the disk budget."""
    spec = at_plan_budget(spec, plan)
    dims = resolve_dims(spec.model, access)  # config.json by descriptor, capped
    pretrained = Path(spec.model.path) if isinstance(spec.model, PathModel) else None
    if plan.runtime == "resident":
        cfg = RuntimeConfig(
            spec.precision,
            plan.device,
            plan.micro_batch,
            plan.rounds,
            spec.steps,
            spec.seed,
            spec.seq_len,
            spec.document_mask,
        )
        resident = ResidentRuntime(dims, cfg, spec.optimizer, group)
        if pretrained is not None:
            stream_into(dict(resident.model.named_parameters()), pretrained, access)
        return resident
    cuda = plan.device == "cuda"
    arena_limit = host_arena_limit_bytes(
        spec.budget.host_bytes, dims.params, spec.precision, plan.device
    ) - int(os.environ.get(FAULT_HOST_SHORTFALL_ENV) or 0)
    # ranks of one node share one host copy; one rank a node needs none
    share = NodeShare.create(group, shm_dir) if group and group.local_world > 1 else None
    ws = plan.working_set
    spilled = ws.spilled_layers if ws is not None else 0
    if spilled:
        # the planner spills only layers the host updates (split: past device_layers)
        assert ws is not None and (ws.optimizer == "host" or ws.optimizer == "split"), ws
        assert ws.optimizer == "host" or plan.layers - spilled >= ws.device_layers, (
            f"plan spills {spilled} layers but the device updates the first "
            f"{ws.device_layers} of {plan.layers}"
        )
        spill_dir = spill_dir or Path(tempfile.mkdtemp(prefix="wstrain-spill-"))
    host = HostState.create(
        dims,
        spec.precision,
        pin=cuda,
        fused_adamw=cuda,
        arena_limit_bytes=arena_limit,
        share=share,
        spilled_layers=spilled,
        spill_dir=spill_dir,
        disk_limit_bytes=spec.budget.disk_bytes,
    )
    if group is not None and group.local_rank > 0:
        pass  # the node's local rank 0 fills its copy
    elif pretrained is not None:  # straight into the host tiles
        host.stream_from(pretrained, access)
    else:  # the resident runtime's initial weights for this seed, a tensor at a time
        host.load_tensors(initial_weights(dims, spec.seed))
    if group is not None:
        group.barrier()  # every rank has mapped every tile; the weights are in
        if share is not None:
            share.unlink()
    return WorkingSetRuntime(dims, ws_config(spec, plan), spec.optimizer, host, group)


def ws_config(spec: JobSpec, plan: Plan) -> WorkingSetConfig:
    """The working-set runtime's configuration for a working_set plan."""
    ws = plan.working_set
    assert ws is not None, "a working_set plan carries its working_set section"
    return WorkingSetConfig(
        precision=spec.precision,
        device=plan.device,
        micro_batch=plan.micro_batch,
        chunk=ws.chunk,
        rounds=plan.rounds,
        steps=spec.steps,
        seed=spec.seed,
        seq_len=spec.seq_len,
        r_param=ws.r_param,
        r_grad=ws.r_grad,
        window=plan.window,
        levels=tuple(tuple(row) for row in ws.levels),
        loss_tokens=ws.loss_tokens,
        device_opt_layers={"host": 0, "device": plan.layers, "split": ws.device_layers}[
            ws.optimizer
        ],
        lead_rounds=ws.lead_rounds,
        document_mask=spec.document_mask,
        seq_chunk=ws.seq_chunk,
        window_home=ws.window_home,
        activation_precision=spec.activation_precision,
        overlap=ws.overlap,
        first_levels=tuple(tuple(row) for row in ws.first_levels),
        write_buffer_bytes=ws.write_buffer_bytes,
    )


def mfu_peak(
    device_name: str | None,
    precision: ComputePrecision,
    measured_peak_flops: float | None = None,
    cpu_peak_flops: float | None = None,
) -> tuple[float, str] | None:
    """(FLOP/s, source) a job's MFU divides by. On a GPU (`device_name` as torch reports
    it): the chip table's dense peak at `precision`, source its row; on a chip the table
    does not know, the agent's measured GEMM rate, source "measured" (bf16 jobs only: the
    profile times a bf16 GEMM, and the table's TF32 and FP32 peaks are 2-16x below BF16).
    On CPU (None): the agent's configured peak, source "configured", else None: no MFU."""
    if device_name is None:
        return (cpu_peak_flops, "configured") if cpu_peak_flops else None
    known = peak_flops(device_name, precision)
    if known is not None:
        return known
    if measured_peak_flops and precision == "bf16":
        return measured_peak_flops, "measured"
    return None
