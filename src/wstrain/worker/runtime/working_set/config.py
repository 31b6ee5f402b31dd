"""What the working-set runtime (working_set/schedule.py) is told to do: the plan's rings,
window, saved-activation levels, LM-head block, lead pass and optimizer placement, with the
two rules derived from them (where a (layer, chunk)'s saved set lives, which optimizer
groups update where). worker/build.py builds it from a Plan; tests build it directly.

    cfg = WorkingSetConfig(precision="bf16", device="cuda", micro_batch=4, chunk=1, ...)
"""

from __future__ import annotations

from dataclasses import dataclass

from wstrain.contracts.calibration import WRITE_BUFFER_BYTES
from wstrain.contracts.step_shape import piece_count, piece_spans


@dataclass(frozen=True)
class WorkingSetConfig:
    precision: str  # "bf16" (pure 16-bit state) | "mixed" (fp32 master on the host) | "fp32"
    device: str
    micro_batch: int  # sequences per round
    chunk: int  # sequences per chunk; divides micro_batch
    rounds: int
    steps: int
    seed: int
    seq_len: int
    r_param: int = 3  # weight slots on the device
    r_grad: int = 2  # gradient slots on the device
    window: int = 2  # last layers whose saved activations stay on the device
    levels: tuple[tuple[int, ...], ...] = ()  # [layer][unit]; () = all level 0
    loss_tokens: int = 4096  # LM-head token block: logits never materialise whole
    # Leading layers whose AdamW runs on the device over streamed moments; the rest run on
    # the host. 0: all on the host; all layers: the embedding and head on the device too;
    # in between ("split"): the embedding on the device, the head on the host.
    device_opt_layers: int = 0
    write_buffer_bytes: int = WRITE_BUFFER_BYTES  # saved activations in flight to the host, at most
    lead_rounds: int = 1  # rounds whose sequences the step's first pass carries
    document_mask: bool = False  # attention within packed documents, positions per document
    # Tokens per piece of a sequence for long context (working_set/sequence_chunks.py): each
    # layer runs a chunk's sequences a piece at a time against a context window of K and V;
    # 0 = whole sequences.
    seq_chunk: int = 0
    # the pieces' window of K and V (and their fp32 gradient sums) in pinned host memory,
    # a key block at a time on the device (ops/host_window.py): 12 GiB less device at 1M
    window_home: bool = False
    # "fp8": saved activations go home as block-scaled float8 (working_set/fp8_saves.py)
    activation_precision: str = "bf16"
    # Cross-round overlap (working_set/pass_order.py): every pass after the step's first runs
    # its forward layer by layer beside the previous pass's backward, so saved sets travel
    # during backwards too. The first pass has no backward beside it: `first_levels` are
    # its levels ([layer][unit]; () = `levels`).
    overlap: bool = False
    first_levels: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.pieces > 1 and self.lead_rounds != 1:
            raise ValueError(
                f"seq_chunk={self.seq_chunk} (long context by pieces) runs one round a pass; "
                f"lead_rounds={self.lead_rounds}: set lead_rounds=1"
            )
        if self.overlap and self.pieces > 1:
            raise ValueError(
                f"overlap=True runs whole sequences; seq_chunk={self.seq_chunk} cuts them into "
                "pieces, whose context windows one pass at a time holds: set overlap=False"
            )

    @property
    def chunks(self) -> int:
        return self.micro_batch // self.chunk

    @property
    def pieces(self) -> int:
        """Pieces each sequence is cut into (1 without seq_chunk)."""
        return piece_count(self.seq_len, self.seq_chunk)

    @property
    def units(self) -> int:
        """(chunk, piece) units of a round, the runtime's unit of work and of saving."""
        return self.chunks * self.pieces

    def spans(self) -> list[tuple[int, int]]:
        """Each piece's rows [s0, s1) of a sequence."""
        return piece_spans(self.seq_len, self.seq_chunk)

    def placement(
        self, layer: int, chunk: int, layers: int, first: bool = False
    ) -> tuple[int, bool]:
        """(level, home) of a (layer, unit) (a unit is a chunk, or a piece of one with
        seq_chunk) in the step's `first` pass or a later one. A lead pass's chunks past the
        first round's take their round's levels, but in the window they go home at level 1:
        the window's device memory is planned for one round."""
        levels = self.first_levels if first and self.first_levels else self.levels
        level = levels[layer][chunk % self.units] if levels else 0
        home = layer < layers - self.window
        if chunk >= self.units and not home:
            return 1, True
        return level, home

    def optimizer_groups(self, layers: int) -> tuple[list[int], list[int]]:
        """(device groups, host groups) in update order: layers, then embedding (group
        `layers`) and head (`layers + 1`) as HostState numbers them."""
        k, L = self.device_opt_layers, layers
        if k == 0:
            return [], [L, *range(L), L + 1]  # as the next step reads them
        if k == L:
            return [*range(L), L, L + 1], []
        return [*range(k), L], [*range(k, L), L + 1]
