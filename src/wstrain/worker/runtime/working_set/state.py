"""The host-side training state of the working-set runtime: per-layer flat tiles of weights,
gradients and AdamW moments in one accounted `HostArena`, plus the embedding and the head
group, and the CPU AdamW that updates them group by group (working_set/host_optim.py runs it
beside the next step's forward).

Precision: "bf16" keeps every tile in bf16 (8 bytes a parameter, as AdaWS), "fp32" in fp32;
"mixed" streams bf16 weights and gradients but keeps an fp32 master copy and fp32 moments
(16 bytes a parameter, plus one fp32 gradient scratch the size of the largest group): the
update runs on the master and rounds it into the bf16 weight tile the device reads.

The disk tier (`spilled_layers`): the last N decoder layers' AdamW moments live in a spill
file instead (working_set/spilled.py), each update binding them from one of the arena's
SPILL_SLOTS slots; checkpoints stream them through a slot, so a checkpoint written under one
spill resumes under any other.

Data parallel on one node (`share`, working_set/node_share.py): the tiles are one copy in
shared memory and each rank's AdamW updates only its span of every group (`spans`).

    host = HostState.create(dims, "bf16", pin=torch.cuda.is_available())
    host.load_state_dict(hf_named_tensors); ...; host.step_group(k, lr, clip_coef, spec)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import torch

from wstrain.contracts.access import DataAccess
from wstrain.contracts.model_dims import ModelDims
from wstrain.contracts.spec import OptimizerSpec
from wstrain.worker.io.hf_load import stream_into
from wstrain.worker.runtime.working_set.arena import HostArena, LayerLayout, Tile
from wstrain.worker.runtime.working_set.node_share import NodeShare, UpdateCounters, shard_span
from wstrain.worker.runtime.working_set.spill import DONE, IoOp, RawFile, align_up
from wstrain.worker.runtime.working_set.spilled import (
    CHECKPOINT_FILE,
    Slot,
    SpilledCheckpoint,
    SpilledMoments,
)

# what crosses PCIe and what the device computes in, by precision
DTYPES = {"bf16": torch.bfloat16, "mixed": torch.bfloat16, "fp32": torch.float32}


class HostState:
    def __init__(
        self,
        dims: ModelDims,
        precision: str,
        arena: HostArena,
        fused_adamw: bool = False,
        spilled_layers: int = 0,
        spill_dir: Path | None = None,
        disk_limit_bytes: int | None = None,
        spill_buffered: bool = False,
    ) -> None:
        """spilled_layers: the last N decoder layers' moments live in `spill_dir`'s spill
        file (working_set/spilled.py), checked against `disk_limit_bytes` (None: unchecked);
        spill_buffered forces its buffered I/O (tests)."""
        self.dims, self.precision, self.arena = dims, precision, arena
        self.layout = LayerLayout.decoder(dims)
        self.embed_layout = LayerLayout.embedding(dims)
        self.head_layout = LayerLayout.head(dims)
        dtype = DTYPES[precision]
        L = dims.num_layers

        def tiles(kind: str, layout: LayerLayout, prefix: str, n: int) -> list[torch.Tensor]:
            return arena.alloc_many(
                [
                    Tile(f"{prefix}{i}.{kind}", layout.numel, dtype, kind, shared=True)
                    for i in range(n)
                ]
            )

        self.weights = tiles("weights", self.layout, "layer", L)
        self.grads = tiles("gradients", self.layout, "layer", L)
        self.embed_w, self.embed_g, self.head_w, self.head_g = (
            tiles(kind, layout, name, 1)[0]
            for kind, layout, name in (
                ("weights", self.embed_layout, "embed"),
                ("gradients", self.embed_layout, "embed"),
                ("weights", self.head_layout, "head"),
                ("gradients", self.head_layout, "head"),
            )
        )
        self.groups = [
            *zip(self.weights, self.grads),
            (self.embed_w, self.embed_g),
            (self.head_w, self.head_g),
        ]
        share = arena.share
        state_dtype = torch.float32 if precision == "mixed" else dtype
        rank, world = (share.rank, share.world) if share is not None else (0, 1)
        # this rank's [lo, hi) of each group: what its AdamW updates (all of it on one rank)
        self.spans = [shard_span(w.numel(), rank, world) for w, _ in self.groups]
        self.updates = UpdateCounters(len(self.groups), share)
        # mixed: the fp32 master of each group, and the fp32 gradient its update reads
        # (host-only tiles: never page-locked)
        self.master = (
            [
                arena.alloc(
                    f"group{i}.master",
                    w.numel(),
                    torch.float32,
                    "master",
                    crosses_pcie=False,
                    shared=True,
                )
                for i, (w, _) in enumerate(self.groups)
            ]
            if precision == "mixed"
            else []
        )
        self.grad_fp32 = (
            arena.alloc(
                "grad_fp32",
                max(hi - lo for lo, hi in self.spans),
                torch.float32,
                "gradients",
                crosses_pcie=False,
            )
            if self.master
            else None
        )
        self.params: list[torch.nn.Parameter] = []
        self.optimizers: list[torch.optim.AdamW] = []
        # whole (m, v) tiles; None for a spilled layer, whose moments come through a slot
        self.moments: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        self.spill: SpilledMoments | None = None
        if spilled_layers:
            assert 0 < spilled_layers <= L and spill_dir is not None, (spilled_layers, spill_dir)
            # one copy a node of shared tiles, but a spill file and slots a process: unplanned
            assert share is None or share.world == 1, "data parallel ranks do not spill"
            self.spill = SpilledMoments(
                arena,
                L - spilled_layers,
                spilled_layers,
                self.layout.numel,
                state_dtype,
                spill_dir,
                disk_limit_bytes,
                spill_buffered,
            )
        # AdamW's moments live in the arena too, not in torch's own allocations, page-locked
        # together (the device optimizer streams bf16 moments; mixed keeps them on the host)
        held = [i for i in range(len(self.groups)) if self.spill is None or not self.spill.holds(i)]
        moment_tiles = [
            Tile(f"group{i}.{short}", self.groups[i][0].numel(), state_dtype, "moments",
                 crosses_pcie=not self.master, shared=True)
            for i in held
            for short in ("m", "v")
        ]  # fmt: skip
        made = iter(arena.alloc_many(moment_tiles))
        moments = {i: (next(made), next(made)) for i in held}
        for i, (w, g) in enumerate(self.groups):
            lo, hi = self.spans[i]
            # shares the tile's storage: the weight tile, or in mixed the master
            p = torch.nn.Parameter(
                (self.master[i] if self.master else w)[lo:hi], requires_grad=True
            )
            p.grad = None if self.master else g[lo:hi]
            opt = torch.optim.AdamW([p], fused=fused_adamw or None)
            if self.spill is not None and self.spill.holds(i):
                slot = self.spill.slots[0]  # bound for real to its slot at each update
                opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": slot.m, "exp_avg_sq": slot.v}
                self.moments.append(None)
                self.params.append(p)
                self.optimizers.append(opt)
                continue
            m, v = moments[i]
            opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": m[lo:hi], "exp_avg_sq": v[lo:hi]}
            self.moments.append((m, v))
            self.params.append(p)
            self.optimizers.append(opt)

    @classmethod
    def create(
        cls,
        dims: ModelDims,
        precision: str,
        pin: bool,
        fused_adamw: bool = False,
        arena_limit_bytes: int | None = None,
        share: NodeShare | None = None,
        spilled_layers: int = 0,
        spill_dir: Path | None = None,
        disk_limit_bytes: int | None = None,
        spill_buffered: bool = False,
    ) -> HostState:
        """fused_adamw: torch's fused CPU AdamW (several times faster; rounds differently);
        arena_limit_bytes: what the arena may hold in all (working_set/arena.py HostArena);
        share: the node's one copy for data-parallel ranks; spilled_layers, spill_dir,
        disk_limit_bytes, spill_buffered: the disk tier (__init__)."""
        arena = HostArena(pin, arena_limit_bytes, share)
        return cls(
            dims,
            precision,
            arena,
            fused_adamw,
            spilled_layers,
            spill_dir,
            disk_limit_bytes,
            spill_buffered,
        )

    # ------------------------------------------------------------ named tensors (HF names)

    def _named_views(self, grads: bool = False) -> dict[str, torch.Tensor]:
        if grads:
            tiles = [*self.grads, self.embed_g, self.head_g]
        else:  # mixed: the master is the weights of record
            tiles = self.master or [*self.weights, self.embed_w, self.head_w]
        layers, embed, head = tiles[:-2], tiles[-2], tiles[-1]
        out = {}
        for k, w in enumerate(layers):
            for n, v in self.layout.hub_views(w).items():
                out[f"model.layers.{k}.{n}"] = v
        out.update(self.embed_layout.views(embed))
        out.update(self.head_layout.views(head))
        return out

    def weight_views(self) -> dict[str, torch.Tensor]:
        """Weight views under Hugging Face parameter names (no copies): in mixed precision
        the fp32 master, so a checkpoint keeps full precision. Write them only through
        load_state_dict, load_tensors or stream_from, which also round them into the bf16 tiles."""
        return self._named_views()

    def named_grads(self) -> dict[str, torch.Tensor]:
        """Gradient views under Hugging Face parameter names (no copies)."""
        return self._named_views(grads=True)

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        self.load_tensors(tensors.items())

    def load_tensors(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Every weight, (HF name, tensor) pairs taken one at a time: a stream holds only
        the tensors its producer draws ahead beside the tiles (worker/models/initial.py)."""
        views = self._named_views()
        seen = set()
        with torch.no_grad():
            for n, t in tensors:
                if n in views:
                    views[n].copy_(t)
                    seen.add(n)
        missing = sorted(set(views) - seen)
        if missing:
            raise KeyError(f"state dict lacks {missing[:4]}{'...' if len(missing) > 4 else ''}")
        self._round_master()

    def stream_from(self, directory: Path, access: DataAccess | None = None) -> None:
        """Weights from a Hugging Face or checkpoint directory, tensor by tensor; a user's
        directory is read through `access` (see io/hf_load.stream_into)."""
        stream_into(self.weight_views(), directory, access)
        self._round_master()

    def _round_master(self, group: int | None = None) -> None:
        """Mixed precision: the bf16 weight tiles the device reads, from the master."""
        if not self.master:
            return
        if group is None:
            for i, master in enumerate(self.master):
                self.groups[i][0].copy_(master)
            return
        lo, hi = self.spans[group]  # the span this rank updated
        self.groups[group][0][lo:hi].copy_(self.master[group][lo:hi])

    def optimizer_state(self) -> dict[str, object]:
        """Whole moment tiles (every rank's span: wait for the ranks' updates first), so a
        checkpoint loads into any number of ranks. A spilled layer's moments go into the
        checkpoint as a raw file streamed through a slot (`files`: io/checkpoint.py writes
        it; `spilled`: its layout), so a checkpoint loads under any other spill."""
        out: dict[str, object] = {
            "adamw": [
                {
                    "step": o.state[p]["step"].clone(),
                    "exp_avg": mv[0] if mv else None,
                    "exp_avg_sq": mv[1] if mv else None,
                }
                for o, p, mv in zip(self.optimizers, self.params, self.moments)
            ]
        }
        if self.spill is not None:
            out["spilled"] = self.spill.record()
            out["files"] = {CHECKPOINT_FILE: SpilledCheckpoint(self.spill)}
        return out

    def load_optimizer_state(self, extra: dict[str, object]) -> None:
        """Each rank reads its span of the saved whole tiles. Layer by layer, from where the
        checkpoint has a layer's moments (optimizer.pt, or its raw file) to where they live
        now (an arena tile, or the spill file), so no more than a slot is read at once."""
        spilled = cast(dict[str, Any] | None, extra.get("spilled"))
        source = None
        if spilled is not None:
            path = Path(cast(str, extra["checkpoint_dir"])) / spilled["file"]
            numel, dtype = spilled["numel"], getattr(torch, spilled["dtype"])
            assert (numel, dtype) == (self.layout.numel, self.moment_dtype), (
                f"{path}: moments of {numel} {dtype}, this run's layers {self.layout.numel} "
                f"{self.moment_dtype}"
            )
            size = len(spilled["layers"]) * spilled["record_bytes"]
            source = RawFile(path, size, create=False)
        if self.spill is not None:
            self.spill.invalidate()
        try:
            for i, saved in enumerate(cast(list[dict[str, Any]], extra["adamw"])):
                self._load_group(i, saved, spilled, source)
        finally:
            if source is not None:
                source.close()

    def _load_group(
        self,
        i: int,
        saved: dict[str, Any],
        spilled: dict[str, Any] | None,
        source: RawFile | None,
    ) -> None:
        o, p, (lo, hi) = self.optimizers[i], self.params[i], self.spans[i]
        state = o.state[p]
        state["step"].copy_(saved["step"])
        in_file = saved["exp_avg"] is None
        offset = 0
        if in_file:  # the checkpoint's raw file holds this layer's record
            assert spilled is not None and source is not None
            offset = spilled["layers"].index(i) * spilled["record_bytes"]
        if self.spill is not None and self.spill.holds(i):  # into the spill file

            def fill(slot: Slot) -> IoOp:
                if in_file:
                    assert source is not None
                    return source.read(offset, slot.views)
                slot.m.copy_(saved["exp_avg"])
                slot.v.copy_(saved["exp_avg_sq"])
                return DONE

            self.spill.load_layer(i, fill)
        elif in_file:  # straight into the arena tiles
            assert source is not None
            views = [self.arena.page_view(f"group{i}.{s}") for s in ("m", "v")]
            n = align_up(self.layout.numel * self.moment_dtype.itemsize)  # whole pages
            source.read(offset, [v[:n] for v in views]).wait()
        else:
            state["exp_avg"].copy_(saved["exp_avg"][lo:hi])
            state["exp_avg_sq"].copy_(saved["exp_avg_sq"][lo:hi])

    @property
    def moment_dtype(self) -> torch.dtype:
        return torch.float32 if self.precision == "mixed" else DTYPES[self.precision]

    # ------------------------------------------------------------ optimizer

    def step_group(self, group: int, lr: float, clip_coef: float, spec: OptimizerSpec) -> None:
        """AdamW on one group's tiles (layer k = k; embedding L; head L + 1), its gradient
        first scaled by the global-norm clipping factor."""
        p, opt = self.params[group], self.optimizers[group]
        lo, hi = self.spans[group]
        spilled = self.spill is not None and self.spill.holds(group)
        if spilled:  # bound to the slot its moments came into (read in, waited for)
            assert self.spill is not None
            state = opt.state[p]
            state["exp_avg"], state["exp_avg_sq"] = self.spill.acquire(group)
        if self.grad_fp32 is not None:  # mixed: the bf16 gradient read once into fp32
            p.grad = self.grad_fp32[: p.numel()]
            p.grad.copy_(self.groups[group][1][lo:hi])
        fused, clipped = bool(opt.defaults.get("fused")), clip_coef < 1.0
        if clipped and not fused:
            assert p.grad is not None  # the tile's gradient view, bound above
            p.grad.mul_(clip_coef)
        # the fused kernel divides the gradient by `grad_scale` as it reads it: clipping
        # then costs no pass of its own over the gradient (a fifth of the update's traffic)
        scale = torch.tensor(1.0 / clip_coef) if clipped and fused else None
        opt.grad_scale = scale  # type: ignore[attr-defined]
        for g in opt.param_groups:
            g.update(lr=lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay)
        opt.step()
        if spilled:  # written back beside the next update
            assert self.spill is not None
            self.spill.release(group)
        self._round_master(group)
        self.updates.mark(group)
