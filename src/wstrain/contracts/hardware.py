"""What the planners know about a node: the measured hardware profile (worker/profile/node.py,
taken by the scheduler agent once per GPU model / driver / torch and cached), as numbers the
cost model uses. Torch-free, so the API can dry-run plans.

    node = NodeProfile.from_profile("cuda", node_record.profile, gpu_bytes, host_bytes)
    node.attention_flops(8192)       # FLOP/s of causal attention fwd+bwd at that length

SHIPPED_PROFILES["h100"] is the profile a plan for a chip no node has uses (`wstrain plan
--gpu h100`): measured on the bench's H100 and H200, built from the datasheet for the rest.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Final, Literal

from wstrain.contracts.calibration import GIB
from wstrain.contracts.chips import BOARDS, GPU_NAMES, H100_SXM, Chip, GpuName
from wstrain.contracts.chips import H200 as H200_CHIP

Device = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class LayerTimes:
    """One real decoder layer of the job's model, timed on the node (worker/profile/layer.py):
    seconds per sequence of `seq_len` tokens."""

    seq_len: int
    forward_s: float
    backward_s: float
    attention_forward_s: float
    mlp_forward_s: float

    @classmethod
    def from_json(cls, measured: dict[str, float]) -> LayerTimes:
        return cls(
            int(measured["seq_len"]),
            measured["forward_s"],
            measured["backward_s"],
            measured["attention_forward_s"],
            measured["mlp_forward_s"],
        )


@dataclass(frozen=True)
class NodeProfile:
    device: Device
    matmul_flops: float  # practical dense-matmul FLOP/s at a decoder layer's GEMM shape
    optimizer_params_per_s: float  # CPU AdamW parameter updates per second
    device_total_bytes: int
    host_total_bytes: int
    h2d_bytes_per_s: float = 5.0e10  # pinned host->device copies
    d2h_bytes_per_s: float = 5.0e10  # pinned device->host copies
    both_bytes_per_s: float = 4.5e10  # each direction while both run
    # (seq_len, FLOP/s) of causal attention fwd+bwd, ascending, its FLOPs AdaWS's (the
    # backward counted as two forwards; planning/layer_time.py converts); empty: matmul rate
    attention_points: tuple[tuple[int, float], ...] = ()
    # the same for FlashAttention-3's kernels, where the node runs them (its wheel on a Hopper
    # GPU, worker/ops/fa3_attn.py; profile keys attention_flops.fa3.SEQ); empty: it does not
    fa3_attention_points: tuple[tuple[int, float], ...] = ()
    layer: LayerTimes | None = None  # the job's layer measured here, when the agent did
    # (GPUs copying at once, the slowest one's D2H bytes/s), ascending: several GPUs'
    # device-to-host copies can share a ceiling (worker/profile/shared_links.py)
    d2h_by_gpus: tuple[tuple[int, float], ...] = ()
    # the job's packed documents (document_mask), when the agent read them: the tokens a
    # query's document holds, token-weighted (the sum of squared document lengths within
    # each sequence over the tokens); a long sequence's pieces attend within documents
    # (ops/document_attn.py), so their attention costs this span, not the sequence's. 0:
    # no documents, or not known (the attention of a whole sequence: the worst case)
    document_span: int = 0
    # the agent's spill directory (the disk tier, WorkingSetPlan.spilled_layers), measured in
    # the node profile with direct I/O in 16 MiB blocks: each direction alone, bytes/s; 0: no
    # spill directory, so no plan spills. The lent H200's virtio disk: 1.5-2.2 read, 1.7-2.4
    # write GB/s, one machine to the next
    disk_read_bytes_per_s: float = 0.0
    disk_write_bytes_per_s: float = 0.0
    # bytes/s moved both ways together in the spill's own order (two slots, each record's
    # read chained after the write that frees its slot, worker/profile/disk.py): what a step
    # gets. Lent H200s' disks: 2.25-2.30 GB/s where the directions apart give 2.1 on one,
    # 2.20 against 2.25 on another. 0: not measured (the directions at their own rates)
    disk_both_bytes_per_s: float = 0.0
    # the loss's logits a second as the runtimes compute it (worker/profile/node.py
    # loss_logits_per_s: the bf16 logits cast to fp32, cross-entropy forward and backward,
    # the gradient cast back), memory-bound where the head's GEMM is not: 0.11 s a step for
    # 65,536 tokens over Llama-3's 128,256 words on an H200, 8% of a 4-layer step. 0: not
    # measured (no term)
    loss_logits_per_s: float = 0.0

    @classmethod
    def from_profile(
        cls,
        device: Device,
        profile: dict[str, float],
        device_total_bytes: int,
        host_total_bytes: int,
    ) -> NodeProfile:
        # Defaults for records of agents that predate a key: a CPU node's "link" is memcpy.
        link = 5.0e10 if device == "cuda" else 1.0e10

        def points(prefix: str) -> tuple[tuple[int, float], ...]:  # keys PREFIX.N, ascending
            return tuple(
                sorted(
                    (int(k[len(prefix) :]), v)
                    for k, v in profile.items()
                    if k.startswith(prefix) and k[len(prefix) :].isdigit()
                )
            )

        return cls(
            device,
            profile.get("matmul_flops", 1e10),
            profile.get("optimizer_params_per_s", 1e8),
            device_total_bytes,
            host_total_bytes,
            profile.get("h2d_bytes_per_s", link),
            profile.get("d2h_bytes_per_s", link),
            profile.get("both_bytes_per_s", 0.9 * link),
            points("attention_flops."),
            points(f"attention_flops.{FA3_PROFILE_KEY}."),
            d2h_by_gpus=points("d2h_bytes_per_s."),
            disk_read_bytes_per_s=profile.get("disk_read_bytes_per_s", 0.0),
            disk_write_bytes_per_s=profile.get("disk_write_bytes_per_s", 0.0),
            disk_both_bytes_per_s=profile.get("disk_both_bytes_per_s", 0.0),
            loss_logits_per_s=profile.get("loss_logits_per_s", 0.0),
        )

    def with_layer(self, layer: LayerTimes | None) -> NodeProfile:
        return replace(self, layer=layer)

    def with_documents(self, span_tokens: int) -> NodeProfile:
        return replace(self, document_span=span_tokens)

    def shared_by(self, jobs: int) -> NodeProfile:
        """The node as one of `jobs` jobs packed on one GPU sees it: the GPU's PCIe link and
        its compute divided evenly (one working-set job alone keeps an H100 busy: two packed
        ones summed 1.01x one alone, bench/RESULTS.md "Packing"), the device memory not
        (each job's budget is its allocator's hard limit)."""
        if jobs <= 1:
            return self
        layer = self.layer
        if layer is not None:
            layer = replace(
                layer,
                forward_s=layer.forward_s * jobs,
                backward_s=layer.backward_s * jobs,
                attention_forward_s=layer.attention_forward_s * jobs,
                mlp_forward_s=layer.mlp_forward_s * jobs,
            )
        return replace(
            self,
            matmul_flops=self.matmul_flops / jobs,
            attention_points=tuple((s, f / jobs) for s, f in self.attention_points),
            fa3_attention_points=tuple((s, f / jobs) for s, f in self.fa3_attention_points),
            h2d_bytes_per_s=self.h2d_bytes_per_s / jobs,
            d2h_bytes_per_s=self.d2h_bytes_per_s / jobs,
            both_bytes_per_s=self.both_bytes_per_s / jobs,
            loss_logits_per_s=self.loss_logits_per_s / jobs,
            layer=layer,
        )

    def for_ranks(self, ranks: int) -> NodeProfile:
        """The node as each of `ranks` data-parallel ranks on its GPUs sees it: its own GPU,
        but the device-to-host rate measured with that many GPUs copying at once (the
        nearest count measured at or below; both-directions scaled alike)."""
        measured = [rate for gpus, rate in self.d2h_by_gpus if gpus <= ranks]
        if ranks <= 1 or not measured or measured[-1] >= self.d2h_bytes_per_s:
            return self
        share = measured[-1] / self.d2h_bytes_per_s
        return replace(
            self,
            d2h_bytes_per_s=measured[-1],
            both_bytes_per_s=self.both_bytes_per_s * share,
        )

    def piece_kernel(self, device: str, precision: str, documents: bool, head_dim: int) -> str:
        """The kernel a long sequence's pieces run on `device` of this node
        (piece_attention_kernel): FA3 where the node measured it and the model's head dim is
        one it is built for."""
        fa3 = bool(self.fa3_attention_points) and head_dim in FA3_HEAD_DIMS
        return piece_attention_kernel(device, precision, documents, fa3=fa3)

    def whole_kernel(self, device: str, precision: str, documents: bool, head_dim: int) -> str:
        """The kernel a whole sequence's attention runs on `device` of this node
        (whole_attention_kernel): FA3 where the node measured it, causal without document
        masks at a head dim it is built for; else SDPA."""
        fa3 = bool(self.fa3_attention_points) and head_dim in FA3_HEAD_DIMS
        return whole_attention_kernel(device, precision, documents, fa3)

    def for_piece_kernel(self, kernel: str) -> NodeProfile:
        """The node as a plan whose attention runs `kernel` (a piece's, or a whole
        sequence's) sees it: FA3's attention rates where that kernel is FA3's, else the
        profile's own points (SDPA's)."""
        if kernel.startswith(FA3_HOPPER) and self.fa3_attention_points:
            return replace(self, attention_points=self.fa3_attention_points)
        return self

    def attention_flops(self, seq_len: int) -> float:
        """Attention FLOP/s at seq_len: log-linear between measured lengths, clamped."""
        pts = self.attention_points
        if not pts:
            return self.matmul_flops
        if seq_len <= pts[0][0]:
            return pts[0][1]
        for (s0, f0), (s1, f1) in itertools.pairwise(pts):
            if seq_len <= s1:
                w = math.log(seq_len / s0) / math.log(s1 / s0)
                return f0 + w * (f1 - f0)
        return pts[-1][1]


# A conservative profile for dry runs when no agent has registered yet.
DEFAULT_PROFILE = NodeProfile("cpu", 2e10, 5e7, 16 * GIB, 16 * GIB, 1e10, 1e10, 5e9)

# Reference GPUs for tests and examples. H200: DESIGN.md's measured ceilings (55.3 / 55.0 /
# 50.6 GB/s, 787 TFLOP/s matmul, SDPA 521 TFLOP/s at 8K and 571 at 32K); CPU AdamW 4.1 G/s.
H200 = NodeProfile(
    "cuda",
    787e12,
    4.1e9,
    141 * 10**9,
    1536 * GIB,
    55.3e9,
    55.0e9,
    50.6e9,
    ((8192, 521e12), (32768, 571e12)),
)
# AdaWS's H100 (§4.1): 989 TFLOP/s peak, PCIe 5 at ~64 GB/s, 512 GiB host.
H100_ADAWS = NodeProfile("cuda", 989e12, 4.1e9, 80 * GIB, 512 * GIB, 64e9, 64e9, 64e9)


# The kernels a long-context piece's attention can run (worker/ops/prefix_attn.py), fastest
# first where the chip has them. Measured on an H100 at 32K tokens, an 8K piece against a
# 24K prefix, GQA 32:8 (bench/RESULTS.md): cuDNN's prefix (no mask) and diagonal (causal)
# calls merged by log-sum-exp 575 TFLOP/s forward, 561 backward; FA2 through aten's flash
# op in one call (its causal mask aligns bottom-right) 357 and 313. Else the exact fp32
# reference, which merges the same two parts. With packed documents the same kernel runs
# once per document a piece meets (worker/ops/document_attn.py), named with PER_DOCUMENT.
FA3_HOPPER: Final = "fa3-hopper"
FA3_PROFILE_KEY: Final = "fa3"  # a node profile's attention_flops.fa3.SEQ
FA3_HEAD_DIMS: Final = (128,)  # what scripts/build_fa3.sh builds FA3's kernels for
CUDNN_PREFIX_DIAGONAL: Final = "cudnn-prefix-diagonal"
FLASH_LOWER_RIGHT: Final = "flash2-lower-right"
REFERENCE_LSE_MERGE: Final = "reference-lse-merge"
PER_DOCUMENT: Final = "-per-document"


def piece_attention_kernel(
    device: str, precision: str, documents: bool, cudnn: bool = True, fa3: bool = False
) -> str:
    """The kernel a piece's attention runs on `device` ("cuda"/"cpu") at JobSpec precision
    `precision` (the fused kernels take 16-bit inputs only), with or without document masks,
    where FlashAttention-3 (`fa3`: its wheel on a Hopper GPU, bf16 at head dim 128 only) and
    cuDNN's attention (`cudnn`) are or are not available, fastest first."""
    kernel = REFERENCE_LSE_MERGE
    if device == "cuda" and precision != "fp32":
        kernel = FA3_HOPPER if fa3 else CUDNN_PREFIX_DIAGONAL if cudnn else FLASH_LOWER_RIGHT
    return kernel + PER_DOCUMENT * documents


SDPA: Final = "sdpa"  # a whole sequence's attention through torch's SDPA (models/dense.py)


def whole_attention_kernel(device: str, precision: str, documents: bool, fa3: bool) -> str:
    """The kernel a whole sequence's attention runs (worker/models/dense.py): FA3 (`fa3`: its
    wheel on a Hopper GPU at a head dim it is built for) for causal 16-bit attention on CUDA
    without document masks, one launch each way; else SDPA, which picks its own backend."""
    fused = device == "cuda" and precision != "fp32" and not documents
    return FA3_HOPPER if fused and fa3 else SDPA


# Profile-key format (worker/profile/node.py): bump when the measured keys change meaning,
# so caches refresh.
PROFILE_VERSION: Final = 7


def profile_cache_key(gpu: str, driver: str, torch_version: str, fa3: bool) -> str:
    """What a cached node profile is valid for: GPU model (torch's name) and driver, or "cpu"
    and the host's CPU count; the torch version; FA3's kernels present (a node that
    installs them measures their rates anew); the profile format."""
    gpu = gpu.replace(" ", "-")
    return f"v{PROFILE_VERSION}_{gpu}_{driver}_torch{torch_version}{'_fa3' if fa3 else ''}"


def cpu_profile_cache_key(cpus: int, torch_version: str) -> str:
    """profile_cache_key of a host without GPUs."""
    return profile_cache_key("cpu", f"{cpus}cpus", torch_version, False)


# ----------------------------------------------------------------- shipped profiles


@dataclass(frozen=True)
class ShippedProfile:
    """A node profile wstrain ships, to plan for a chip no node of the queue has (`wstrain
    plan --gpu NAME`): an agent's profile record (worker/profile/node.py's keys), one GPU's
    memory and the host's as torch and the OS report them, and where the numbers come from."""

    gpu: str  # the --gpu name (contracts/chips.py GPU_NAMES)
    label: str  # its row in the chip table
    profile: dict[str, float]
    device_total_bytes: int
    host_total_bytes: int
    source: str

    @property
    def note(self) -> str:
        """What a plan made with it says of itself (its reasons["gpu"])."""
        return (
            f"planned for {self.label} GPUs (--gpu {self.gpu}) from {self.source}, "
            "not on a node of this queue"
        )


# Measured by the agent's node profile on the bench machines (each with a 128 GiB host),
# copied from the plans the bench recorded. H100: the long-context bench of 2026-11-27 after
# its fix (before the loss's rate was measured: no loss term); H200: the runtime bench of
# 2026-11-29.
_H100_MEASURED = ShippedProfile(
    "h100",
    H100_SXM.label,
    {
        "matmul_flops": 795.5e12,
        "optimizer_params_per_s": 4.279e9,
        "h2d_bytes_per_s": 54.95e9,
        "d2h_bytes_per_s": 55.36e9,
        "both_bytes_per_s": 45.98e9,
        "attention_flops.2048": 13.35e12,
        "attention_flops.4096": 327.7e12,
        "attention_flops.8192": 444.7e12,
        "attention_flops.16384": 504.4e12,
        "attention_flops.32768": 484.0e12,
    },
    85017493504,  # torch's total_memory of an "NVIDIA H100 80GB HBM3"
    128 * GIB,
    "the profile measured on an NVIDIA H100 80GB HBM3 (SXM) on 2026-11-27 "
    "(bench/results/long-context/lengths-32k-to-256k-h100-2026-11-27.json)",
)
_H200_MEASURED = ShippedProfile(
    "h200",
    H200_CHIP.label,
    {
        "matmul_flops": 775.2e12,
        "optimizer_params_per_s": 5.082e9,
        "h2d_bytes_per_s": 52.70e9,
        "d2h_bytes_per_s": 54.92e9,
        "both_bytes_per_s": 45.03e9,
        "disk_read_bytes_per_s": 0.0,  # no spill directory
        "disk_write_bytes_per_s": 0.0,
        "disk_both_bytes_per_s": 0.0,
        "loss_logits_per_s": 75.72e9,
        "attention_flops.2048": 10.27e12,
        "attention_flops.4096": 341.9e12,
        "attention_flops.8192": 449.6e12,
        "attention_flops.16384": 494.5e12,
        "attention_flops.32768": 477.5e12,
    },
    150109880320,  # torch's total_memory of an "NVIDIA H200"
    128 * GIB,
    "the profile measured on an NVIDIA H200 on 2026-11-29 "
    "(bench/results/queue/planner-with-the-loss-4-and-8-layers-h200-2026-11-29.json)",
)
# The share of its datasheet memory a card leaves to torch: the H100 80GB 85017493504 bytes
# of 80 GiB (0.990), the H200 150109880320 of 141 GiB (0.991).
USABLE_MEMORY_SHARE: Final = 85017493504 / (80 * GIB)


def _from_datasheet(gpu: GpuName, chip: Chip) -> ShippedProfile:
    """A chip nobody measured: the H100's measured profile with its compute scaled by the
    dense BF16 peaks (the measured H100 reached 795 of 989 TFLOP/s in matmuls; the same
    share is assumed), its host links by PCIe generation (Gen4 x16 carries half of Gen5's
    64 GB/s), its memory from the datasheet; the host's CPU AdamW rate kept."""
    board = BOARDS[chip.label]
    flops = chip.bf16_flops_per_s / H100_SXM.bf16_flops_per_s
    link = 1.0 if board.pcie_generation >= 5 else 0.5
    measured = _H100_MEASURED.profile
    profile = {
        key: value * (link if key.endswith("bytes_per_s") else 1.0 if "optimizer" in key else flops)
        for key, value in measured.items()
    }
    return ShippedProfile(
        gpu,
        chip.label,
        profile,
        int(board.memory_gib * GIB * USABLE_MEMORY_SHARE),
        _H100_MEASURED.host_total_bytes,
        f"its datasheet, not a measurement: the measured H100's profile with compute "
        f"x{flops:.2f} ({chip.bf16_flops_per_s / 1e12:.0f} of 989 dense BF16 TFLOP/s), host "
        f"links x{link:g} (PCIe Gen{board.pcie_generation}), {board.memory_gib} GB",
    )


# Every --gpu name's profile: measured where a bench ran on the chip, else from its datasheet.
SHIPPED_PROFILES: Final[dict[GpuName, ShippedProfile]] = {
    gpu: {"h100": _H100_MEASURED, "h200": _H200_MEASURED}.get(gpu) or _from_datasheet(gpu, chip)
    for gpu, chip in GPU_NAMES.items()
}
