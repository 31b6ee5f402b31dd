"""contracts/token_file.py's document_span over a token file `wstrain prepare` wrote: the
token-weighted length of a query's document within its sequence, against a count over every
token of documents of known lengths.

    pytest tests/contracts/test_token_file.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from wstrain.contracts.token_file import document_span
from wstrain.prepare.pipeline import PrepareRequest, prepare


def _by_token(lengths: list[int], seq_len: int) -> float:
    """Each token's document part within its sequence, averaged over the tokens."""
    doc = np.repeat(np.arange(len(lengths)), lengths)
    spans = []
    for s0 in range(0, len(doc), seq_len):
        _, counts = np.unique(doc[s0 : s0 + seq_len], return_counts=True)
        spans += [c for c in counts for _ in range(c)]  # each token sees its part's length
    return float(np.mean(spans))


def test_the_span_of_a_prepared_files_documents(tmp_path: Path) -> None:
    rng = random.Random(0)
    texts = ["x" * rng.randint(1, 3000) for _ in range(400)]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "docs.bin"
    prepare(PrepareRequest(str(src), str(out)))  # the byte tokenizer: a token a byte, + eos
    lengths = [len(t) + 1 for t in texts]
    for seq_len in (512, 1000, 4096, 1 << 20):
        assert document_span(out, seq_len) == round(_by_token(lengths, seq_len)), seq_len
    assert document_span(tmp_path / "none.bin", 512) == 0  # no index beside it
