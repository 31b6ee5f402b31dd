"""AdamW on the host (CPU), deferred into the next step's forward and overlapped with it.

Clipping needs the global gradient norm before any update, so no layer can update during
its own backward. Instead the runtime sums the squared norm on the device as each layer's
final gradient goes home (no host pass over the gradients), and when the step's backward
ends a host thread updates its groups in the order the next step needs them — embedding,
layers 0..L-1, head; or only the later layers and the head where the device takes the first
ones (working_set/device_optim.py) — while the main thread already runs the next forward: loading
layer k's weights waits only for layer k's update (the wait is the step's `optimizer` stall).

    opt = HostOptimizerPipeline(host, spec, device)
    opt.start(update, groups)   # at the end of step update.step, groups in update order
    opt.wait(k)          # before host tile k is read again;  opt.flush()  before checkpoints

Spilled layers (working_set/spilled.py): the thread reads their moments ahead into the
spill slots and writes them back beside the next updates; its waits on the disk are the
step's `spill` stall (of the AdamW thread, not of the device).

Data parallel: each rank's thread updates its span of each group (working_set/state.py), and
wait/flush also wait for the other ranks' spans.
"""

from __future__ import annotations

import os
import threading

import torch

from wstrain.contracts.spec import OptimizerSpec
from wstrain.worker.runtime.optim import StepUpdate
from wstrain.worker.runtime.working_set.state import HostState


def leave_a_core_to_the_driver() -> None:
    """Run torch's CPU thread pool on all cores but one (unless set lower already): the
    AdamW thread's workers then do not preempt the thread that drives the GPU. Alone, the
    fused AdamW runs a Llama-3-8B layer in 31 ms on 15 or 16 of the H200 host's 16 cores
    (bench/host_adamw.py); beside a training step it took ~48 ms on 16. Data-parallel
    ranks of one node (LOCAL_WORLD_SIZE) split the cores, as they split each update."""
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    cores = len(os.sched_getaffinity(0)) // ranks
    if cores > 2 and torch.get_num_threads() >= cores:
        torch.set_num_threads(cores - 1)


class HostOptimizerPipeline:
    def __init__(self, host: HostState, spec: OptimizerSpec, device: torch.device) -> None:
        self.host, self.spec = host, spec
        if device.type == "cuda":
            leave_a_core_to_the_driver()
        self.groups = len(host.params)  # L layers, then the embedding (L), the head (L + 1)
        self.done = [threading.Event() for _ in range(self.groups)]
        for event in self.done:
            event.set()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self, update: StepUpdate, groups: list[int]) -> None:
        """Gradients of `update.step` are complete and home: start updating `groups`, in
        that order."""
        self.flush()
        for group in groups:
            self.done[group].clear()
        # not a daemon: an exiting interpreter finishes the update instead of killing a
        # thread inside a torch kernel (std::terminate)
        self.thread = threading.Thread(
            target=self._run, args=(groups, update.lr, update.clip_coef), name="host-adamw"
        )
        self.thread.start()

    def _run(self, order: list[int], lr: float, coef: float) -> None:
        try:
            if self.host.spill is not None:  # spilled layers' moments: reads ahead now
                self.host.spill.start_pass(order)
            for group in order:
                self.host.step_group(group, lr, coef, self.spec)
                self.done[group].set()
        except BaseException as exc:  # surfaced by wait()/flush() on the main thread
            self.error = exc
            for event in self.done:
                event.set()

    def is_done(self, group: int) -> bool:
        return self.done[group].is_set()

    def wait(self, group: int) -> None:
        """Block until `group`'s update is in its host tiles: this rank's span, then (data
        parallel) every other rank's."""
        self.done[group].wait()
        self._raise()
        self.host.updates.wait_peers(group)

    @property
    def pending(self) -> bool:
        return self.thread is not None

    def flush(self) -> None:
        """Finish any update in flight (checkpoints, evaluation, loading state)."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        self._raise()
        for group in range(self.groups):
            self.host.updates.wait_peers(group)

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"host AdamW failed: {self.error}") from self.error
