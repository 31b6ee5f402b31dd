"""The worker process: runs one attempt of one job, started by the scheduler agent.

    python -m wstrain.worker.main --job-dir STATE/jobs/ID --measured-peak-flops 6e14 \
        --data-roots '["/data"]' --state-dir STATE

It reads `spec.json` and `plan.json` from the job dir, resumes from the latest checkpoint
there, trains, and reports to its agent as JSON lines on stdout (contracts.WorkerMessage);
logs go to stderr. A plan of several ranks (data parallel, one per visible GPU) makes this
process rank 0 of a gang it starts and watches (worker/ranks.py); the ranks train in step,
rank 0 reports and writes the checkpoints. A job on several nodes gets one such worker
a node (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT from its agent): each is its node's
local rank 0, and only node 0's reports and writes checkpoints (to the shared job dir).
SIGTERM asks it to stop at the next step boundary with a checkpoint, and so does a closed
report pipe (its agent died).
The exit code is contracts.WorkerExit: 0 succeeded, 3 cancelled, 1 failed (a crash: the
agent retries it), 4 refused (an InvalidSpec before the first step, such as a data path out
of the data roots or into the state dir), 5 out of a memory budget (worker/budget_exits.py).
Step reports carry MFU against the chip table's dense peak (contracts/chips.py), a measured
GEMM rate on a GPU the table does not know, and on CPU only a peak the agent configures.
The runtime and that peak come from worker/build.py; this module drives them.

    pytest tests/worker/test_main.py
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

from wstrain.contracts.access import DataAccess
from wstrain.contracts.chips import ComputePrecision, compute_precision
from wstrain.contracts.errors import BudgetExceeded, InvalidSpec
from wstrain.contracts.jobs import WorkerExit, WorkerMessage
from wstrain.contracts.model_dims import resolve_dims
from wstrain.contracts.plan import Plan, at_plan_budget
from wstrain.contracts.spec import JobSpec
from wstrain.contracts.step_shape import step_tokens
from wstrain.worker.args import parse_args
from wstrain.worker.budget_exits import budget_exit
from wstrain.worker.build import build_runtime, mfu_peak
from wstrain.worker.io import checkpoint
from wstrain.worker.io.data import TokenStream
from wstrain.worker.ranks import WATCH_INTERVAL_S, NodeOf, RankGang, rank_of_env, torchrun_env
from wstrain.worker.runtime.base import Runtime
from wstrain.worker.runtime.distributed import ProcessGroup
from wstrain.worker.runtime.stats import StepStats, Telemetry
from wstrain.worker.runtime.working_set.spill import SpillSpaceError, remove_spill_file

log = logging.getLogger("worker")
# Step reports are throttled so a fast CPU job does not flood its agent.
REPORT_INTERVAL_S = 0.2
# A rank that refused the spec: rank 0 opens the same files at the same point and refuses
# too, naming the field; 10 s bounds that wait before the gang ends on the rank's exit alone
REFUSAL_WAIT_S = 10.0


def _refused_rank(reason: str) -> str:
    return (
        f"data-parallel gang stopped: {reason}: it refused the spec before training (a file "
        "out of the data roots or in the state dir; not retried)"
    )


class Worker:
    def __init__(
        self,
        job_dir: Path,
        access: DataAccess,
        measured_peak_flops: float | None = None,
        cpu_peak_flops: float | None = None,
        argv: list[str] | None = None,
        shm_dir: Path = Path("/dev/shm"),
        spill_dir: Path | None = None,
    ) -> None:
        """argv: this process's arguments, which the other ranks of a gang start with;
        spill_dir: where a plan's spilled layers' moments live (default job_dir/spill)."""
        self.job_dir, self.access = job_dir, access
        self.argv, self.shm_dir = argv or [], shm_dir
        self.spill_dir = spill_dir or job_dir / "spill"
        self.gang: RankGang | None = None
        self._emit_lock = threading.Lock()  # the gang's watcher reports from its thread
        self.measured_peak_flops, self.cpu_peak_flops = measured_peak_flops, cpu_peak_flops
        spec = JobSpec.model_validate_json((job_dir / "spec.json").read_text())
        self.plan = Plan.model_validate_json((job_dir / "plan.json").read_text())
        self.spec = at_plan_budget(spec, self.plan)  # enforced: its plan's point, no range
        self.node = NodeOf.from_env()  # None: a job on one node
        self.rank = rank_of_env(self.plan.ranks)  # global: only 0 reports and checkpoints
        self.job_id = job_dir.name
        self.cancel_requested = False
        self.orphaned = False  # the agent's end of the report pipe is closed
        self.training = False  # past its checks: an InvalidSpec now is no refusal

    def emit(self, msg: WorkerMessage) -> None:
        if self.rank > 0:  # rank 0 reports for the gang
            return
        try:
            with self._emit_lock:
                sys.stdout.write(msg.model_dump_json(exclude_none=True) + "\n")
                sys.stdout.flush()
        except BrokenPipeError:
            # the agent died: nobody reads our reports. Stop at the next step boundary with
            # a checkpoint, as on SIGTERM; the restarted agent requeues the job from there.
            if not self.orphaned:
                log.warning("job %s: the agent is gone; stopping with a checkpoint", self.job_id)
            self.orphaned = self.cancel_requested = True
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process

    def _request_cancel(self, signum: int, _frame: object) -> None:
        log.info("job %s: signal %d, stopping at the next step boundary", self.job_id, signum)
        self.cancel_requested = True

    def _enforce_device_budget(self) -> None:
        if self.plan.device != "cuda":
            return
        gpu = torch.cuda.current_device()  # a rank's own (ProcessGroup.from_env set it)
        total = torch.cuda.get_device_properties(gpu).total_memory
        fraction = min(1.0, self.spec.budget.device_bytes / total)
        torch.cuda.set_per_process_memory_fraction(fraction, gpu)
        log.info(
            "job %s: device budget %.2f GiB = %.3f of the GPU",
            self.job_id,
            self.spec.budget.device_gib,
            fraction,
        )

    def _telemetry(
        self, telemetry: Telemetry, last: StepStats, runtime: Runtime
    ) -> dict[str, float]:
        host = runtime.host_memory()
        device_peak = None
        if self.plan.device == "cuda":
            device_peak = (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())
        return telemetry.snapshot(last, host.arena_bytes, host.pinned_bytes, device_peak)

    def _mfu_peak(self) -> tuple[ComputePrecision, tuple[float, str] | None]:
        """The job's compute precision and the peak its MFU divides by (None: no MFU)."""
        cuda = self.plan.device == "cuda"
        tf32 = cuda and torch.get_float32_matmul_precision() != "highest"
        precision = compute_precision(self.spec.precision, tf32)
        name = torch.cuda.get_device_name() if cuda else None
        peak = mfu_peak(name, precision, self.measured_peak_flops, self.cpu_peak_flops)
        if peak is not None:
            log.info(
                "job %s: MFU against %.4g TFLOP/s dense %s (%s)",
                self.job_id,
                peak[0] / 1e12,
                precision,
                peak[1],
            )
        else:
            log.info(
                "job %s: no MFU: %s",
                self.job_id,
                f"{name} is not in the chip table and no measured {precision} peak was given"
                if cuda
                else "a CPU job gets one only with the agent's WSTRAIN_CPU_PEAK_FLOPS",
            )
        return precision, peak

    def peer_refused(self) -> bool:
        """Before training, another rank of the gang exited refused: it opened the files
        rank 0 opens, so the spec is refused, not crashed."""
        gang = None if self.training else self.gang
        return gang is not None and any(c.poll() == WorkerExit.refused for c in gang.children)

    def _gang_died(self, reason: str) -> None:
        """A rank died (worker/ranks.py's watcher thread): the gang stops, failed; refused
        when that rank refused the spec before training."""
        log.error("job %s: %s; stopping every rank", self.job_id, reason)
        if self.peer_refused():
            # rank 0 opens the same files and is refused alike moments later, with the field
            # in its own error (its main thread then ends the process); this ends it only if
            # that has not happened in REFUSAL_WAIT_S
            time.sleep(REFUSAL_WAIT_S)
            self.emit(WorkerMessage(kind="error", message=_refused_rank(reason)))
            os._exit(int(WorkerExit.refused))
        self.emit(WorkerMessage(kind="error", message=f"data-parallel gang stopped: {reason}"))
        os._exit(int(WorkerExit.failed))

    def _start_gang(self) -> ProcessGroup | None:
        """Local rank 0 of a several-rank plan starts its node's others; every rank joins
        the group (over every node's ranks: a job on several nodes forms one even with one
        rank a node)."""
        ranks, node = self.plan.ranks, self.node
        nodes = node.nodes if node else 1
        if nodes != self.plan.nodes:
            raise RuntimeError(
                f"the plan spans {self.plan.nodes} node(s) but the agent started this worker "
                f"as one of NNODES={nodes}"
            )
        if "WORLD_SIZE" not in os.environ:  # the worker the agent started
            if ranks > 1:
                self.gang = RankGang.start(ranks, self.argv, self._gang_died, node, main)
            elif node is not None:
                os.environ.update(torchrun_env(0, 1, node.master_port, node))
        group = ProcessGroup.from_env(self.plan.device)
        world = ranks * nodes
        if world > 1 and (group is None or group.world != world):
            raise RuntimeError(
                f"the plan has {ranks} rank(s) on each of {nodes} node(s) but the group is {group}"
            )
        return group

    def run(self) -> WorkerExit:
        signal.signal(signal.SIGTERM, self._request_cancel)
        torch.manual_seed(self.spec.seed)
        group = self._start_gang()
        self._enforce_device_budget()
        dims = resolve_dims(self.spec.model, self.access)  # config.json by descriptor, capped
        runtime = build_runtime(
            self.spec, self.plan, self.access, group, self.shm_dir, self.spill_dir
        )
        evals = self.spec.eval
        data = TokenStream.open(
            self.spec.data,
            dims.vocab_size,
            self.spec.seq_len,
            self.spec.seed,
            evals.heldout_fraction if evals else 0.0,
            self.access,
            global_batch=self.spec.global_batch,
            shuffle=self.spec.shuffle,
        )
        root = self.job_dir / "checkpoints"
        start = 0
        if (ckpt := checkpoint.latest(root)) is not None:
            state, extra = checkpoint.load_meta(ckpt)
            runtime.load_state(ckpt, extra)  # weights stream from the shards
            start = state.step
            log.info("job %s: resumed from %s at step %d", self.job_id, ckpt, start)
        # the runtime's long-lived objects (tile views, slots, templates) leave the
        # collector's generations: full collections then scan only what steps create (a
        # 32-layer job paid ~0.2 s a step scanning them)
        gc.freeze()
        flops_per_token = dims.flops_per_token(self.spec.seq_len)
        precision, peak = self._mfu_peak()
        self.emit(
            WorkerMessage(
                kind="started",
                step=start,
                message=f"pid {os.getpid()} on {self.plan.device}",
                flops_per_token=flops_per_token,
                peak_flops=peak[0] if peak else None,
                peak_source=peak[1] if peak else None,
                precision=precision,
            )
        )
        hf_config = dims.to_hf_config()

        def save(step: int) -> None:
            if self.rank > 0:  # one copy of the state: rank 0 writes it
                return
            path = checkpoint.save(
                root,
                checkpoint.TrainerState(step, step * self.spec.global_batch),
                runtime.state_tensors(),
                runtime.optimizer_state(),
                hf_config,
                keep=self.spec.keep_checkpoints,
            )
            self.emit(WorkerMessage(kind="checkpoint", step=step, path=str(path)))

        last_report = 0.0
        telemetry = Telemetry()
        self.training = True
        nodes = self.node.nodes if self.node else 1
        for step in range(start, self.spec.steps):
            # every rank stops at the same step when any was asked to
            if group.any(self.cancel_requested) if group else self.cancel_requested:
                note = f"stopping at step {step}: writing its checkpoint"
                self.emit(WorkerMessage(kind="stopping", step=step, message=note))
                save(step)
                self._leave(group)
                return WorkerExit.cancelled
            res = runtime.train_step(data, step)
            telemetry.add(res)
            done = step + 1
            tokens_per_s = res.tokens / res.step_seconds
            now = time.monotonic()
            if now - last_report >= REPORT_INTERVAL_S or done == self.spec.steps:
                last_report = now
                self.emit(
                    WorkerMessage(
                        kind="step",
                        step=done,
                        epoch=data.epochs_done(done),
                        tokens_seen=step_tokens(done * self.spec.global_batch, self.spec.seq_len),
                        data_position=done * self.spec.global_batch,
                        loss=res.loss,
                        step_seconds=res.step_seconds,
                        tokens_per_s=tokens_per_s,
                        mfu=flops_per_token * tokens_per_s / (peak[0] * self.plan.ranks * nodes)
                        if peak
                        else None,
                        metrics=self._telemetry(telemetry, res, runtime),
                    )
                )
            due = evals and (done % evals.every_steps == 0 or done == self.spec.steps)
            if evals and due and self.rank == 0:  # rank 0 evaluates; the others go on
                docs = data.eval_documents(evals.sequences) if self.spec.document_mask else None
                held_out = runtime.eval_loss(*data.eval_batch(evals.sequences), docs)
                self.emit(WorkerMessage(kind="eval", step=done, loss=held_out))
            every = self.spec.checkpoint_every
            if every and done % every == 0 and done < self.spec.steps:
                save(done)
        save(self.spec.steps)
        self._leave(group)
        return WorkerExit.succeeded

    def _leave(self, group: ProcessGroup | None) -> None:
        """Every rank is done (rank 0 with its checkpoint): leave the group together, then
        rank 0 waits for the others to exit."""
        if group is not None:
            group.close()
        if self.gang is not None:
            self.gang.join()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.splitlines()[0])
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    access = DataAccess.of(args.data_roots, args.state_dir or args.job_dir.resolve().parent.parent)
    worker = Worker(
        args.job_dir,
        access,
        args.measured_peak_flops,
        args.cpu_peak_flops,
        sys.argv[1:] if argv is None else argv,
        args.shm_dir,
        args.spill_dir,
    )
    code, needs = WorkerExit.failed, dict[str, float]()
    try:
        return int(worker.run())
    except InvalidSpec as exc:
        # a policy refusal (data roots, state dir) or a file that does not fit, found before
        # training: every retry would be refused alike, so it ends the job at once
        msg = f"InvalidSpec: {exc.message}"
        if not worker.training:
            msg = f"{exc.message} (refused by the worker before training; not retried)"
            code = WorkerExit.refused
    except SpillSpaceError as exc:  # a full spill disk at start: fail at once, naming the fix
        msg = f"{exc.strerror} (refused by the worker before training; not retried)"
        code = WorkerExit.refused
    except (torch.cuda.OutOfMemoryError, BudgetExceeded) as exc:  # the plan under-counted
        msg, needs = budget_exit(exc, worker.spec.budget)
        code = WorkerExit.out_of_memory  # not retried as is
    except Exception as exc:  # every failure becomes a reported error with its reason
        msg = f"{type(exc).__name__}: {exc}"
        gang = worker.gang
        if gang is not None and (dead := gang.dead(wait_s=2 * WATCH_INTERVAL_S)) is not None:
            # a peer's death fails rank 0's next collective: name the death, not the symptom
            msg = f"data-parallel gang stopped: {dead}; rank 0 then failed: {msg[:300]}"
            if worker.peer_refused():
                msg, code = _refused_rank(dead), WorkerExit.refused
    finally:
        # whatever the end short of a kill, the spill file goes (a killed worker's is
        # truncated and allocated afresh at the next start)
        remove_spill_file(worker.spill_dir)
    if worker.gang is not None:  # the other ranks would wait in a collective for rank 0
        worker.gang.kill()
    log.error("job %s: failed: %s\n%s", worker.job_id, msg, traceback.format_exc())
    worker.emit(WorkerMessage(kind="error", message=msg, needs_gib=needs))
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
