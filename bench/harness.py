"""What every benchmark child steps and measures with: random tokens to train on, whole
steps timed between device synchronisations, the interpreter's GC pauses, and a process's
proportional set size. Shared by the working-set rows (bench/working_set.py) and the
baselines (bench/baselines.py), so both time the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

log = logging.getLogger("bench.runtime")


class GcPauses:
    """Seconds the interpreter spent collecting garbage, by generation, and the longest
    pause (a host pause drains the GPU's queue like any other host wait)."""

    def __init__(self) -> None:
        self.total_s: dict[str, float] = {}
        self.longest_s = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        pause_s = time.perf_counter() - self._start
        gen = f"gen{info['generation']}"
        self.total_s[gen] = self.total_s.get(gen, 0.0) + pause_s
        self.longest_s = max(self.longest_s, pause_s)

    def per_step(self, steps: int) -> dict[str, float]:
        return {**{k: v / steps for k, v in self.total_s.items()}, "longest": self.longest_s}


def pss_bytes(pid: int) -> int:
    """Proportional set size of a process: its private pages plus its share of shared ones."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


class RandomTokens:
    """Random token ids; with `document_tokens` each sequence is packed documents of that
    many tokens (the last one cut), for document_mask."""

    def __init__(
        self, vocab: int, seq_len: int, device: str, seed: int = 0, document_tokens: int = 0
    ) -> None:
        self.vocab, self.seq_len, self.device = vocab, seq_len, device
        self.gen = torch.Generator(device="cpu").manual_seed(seed)  # a rank's own: its rank
        self.document_tokens = document_tokens

    def documents(self, step: int, round_idx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions, segments), (n, S) each."""
        if not self.document_tokens:
            raise ValueError("RandomTokens without document_tokens has no documents")
        rows = torch.arange(self.seq_len).expand(n, self.seq_len)  # (n, S)
        return rows % self.document_tokens, rows // self.document_tokens

    def batch(self, step: int, round_idx: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), (n, S) each: targets are the inputs shifted by one."""
        t = torch.randint(0, self.vocab, (n, self.seq_len + 1), generator=self.gen)  # (n, S+1)
        return t[:, :-1], t[:, 1:]

    def target_tokens(self, step: int, sequences: int) -> int:
        return sequences * self.seq_len  # every random target counts


def time_steps(step_fn: Callable[[int], object], steps: int) -> list[float]:
    """Seconds of each of `steps` calls of step_fn(i), the device synchronised around each."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times = []
    for i in range(steps):
        sync()
        t0 = time.perf_counter()
        step_fn(i)
        sync()
        times.append(time.perf_counter() - t0)
        log.info("step %d: %.2f s", i, times[-1])
    return times
