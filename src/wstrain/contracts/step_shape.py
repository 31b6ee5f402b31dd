"""How a training step's tokens are cut, said once for the planner and the worker: the
pieces a long sequence runs in (seq_chunk), each piece's token span, and the tokens a step
trains. The planner prices the pieces the runtime will run, so both read these; pure
integer arithmetic, no imports.

    piece_count(32768, 8192)          # 4
    piece_spans(10, 4)                # [(0, 4), (4, 8), (8, 10)]
    step_tokens(64, 8192)             # 524288 tokens a step of 64 sequences
"""

from __future__ import annotations


def piece_count(seq_len: int, seq_chunk: int) -> int:
    """Pieces a sequence of `seq_len` tokens is cut into at `seq_chunk` tokens a piece; 1
    (whole sequences) when seq_chunk is 0 or not shorter than the sequence. The last piece
    may be shorter."""
    if not seq_chunk or seq_chunk >= seq_len:
        return 1
    return -(-seq_len // seq_chunk)


def piece_spans(seq_len: int, seq_chunk: int) -> list[tuple[int, int]]:
    """Each piece's tokens [s0, s1) of a sequence, in order; [(0, seq_len)] for whole
    sequences (piece_count 1)."""
    step = seq_len if piece_count(seq_len, seq_chunk) == 1 else seq_chunk
    return [(s0, min(s0 + step, seq_len)) for s0 in range(0, seq_len, step)]


def step_tokens(sequences: int, seq_len: int) -> int:
    """Tokens `sequences` sequences of `seq_len` tokens hold: a step's over its global batch
    (ranks x rounds x micro_batch sequences), what tokens per second divide."""
    return sequences * seq_len
