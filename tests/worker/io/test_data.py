"""Token files read the same whether raw (.bin) or .npy; the data order is the documented
one (consecutive sequences, a permutation per epoch from (seed, epoch), global_batch of them
a step, then cut into rounds), the same under any plan and across a resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.tokenizers import word_tokenizer_json
from wstrain.contracts.access import DataAccess
from wstrain.contracts.errors import InvalidSpec
from wstrain.contracts.spec import TextData, TokenData
from wstrain.worker.io.data import TokenStream


def test_bin_and_npy_token_files_give_the_same_batches(tmp_path: Path) -> None:
    ids = (np.arange(10_000) * 7919 % 50_000).astype(np.uint32)
    ids.tofile(tmp_path / "t.bin")
    np.save(tmp_path / "t.npy", ids)
    streams = [
        TokenStream.open(
            TokenData(kind="tokens", path=str(tmp_path / f), dtype="uint32"),
            50_000,
            64,
            seed=3,
            global_batch=12,
        )
        for f in ("t.bin", "t.npy")
    ]
    for step, rnd in ((0, 0), (5, 1), (5, 1)):
        (xa, ya), (xb, yb) = (s.batch(step, rnd, 4) for s in streams)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert xa.shape == (4, 64) and torch.equal(xa[:, 1:], ya[:, :-1])
    again = TokenStream.open(
        TokenData(kind="tokens", path=str(tmp_path / "t.bin"), dtype="uint32"),
        50_000,
        64,
        seed=3,
        global_batch=12,
    )
    assert torch.equal(again.batch(7, 2, 4)[0], streams[0].batch(7, 2, 4)[0])
    assert not torch.equal(streams[0].batch(7, 2, 4)[0], streams[0].batch(8, 2, 4)[0])


def test_heldout_split_is_kept_out_of_training(tmp_path: Path) -> None:
    ids = np.arange(20_000, dtype=np.uint32)  # every id names its position
    ids.tofile(tmp_path / "t.bin")
    data = TokenData(kind="tokens", path=str(tmp_path / "t.bin"), dtype="uint32")
    stream = TokenStream.open(data, 20_000, 32, seed=0, heldout_fraction=0.1, global_batch=4)
    for step in range(50):
        _, y = stream.batch(step, 0, 4)
        assert int(y.max()) < 18_000  # training never reads the held-out tail
    ex, ey = stream.eval_batch(6)
    assert int(ex.min()) >= 18_000 and torch.equal(ex[:, 1:], ey[:, :-1])
    assert torch.equal(stream.eval_batch(6)[0], ex)  # the same sequences every time


def test_jsonl_documents_are_packed_with_end_of_text(tmp_path: Path) -> None:
    from wstrain.contracts.spec import TextData
    from wstrain.worker.io.data import _load_tokens

    (tmp_path / "d.jsonl").write_text(
        '{"text": "a b"}\n\n{"text": "c", "id": 2}\n{"body": "d a", "text": "d a"}\n'
    )
    tok = word_tokenizer_json(tmp_path)
    data = TextData(kind="text", path=str(tmp_path / "d.jsonl"), tokenizer=str(tok))
    assert _load_tokens(data, 6, 0, DataAccess.of([tmp_path], None))[0].tolist() == [
        2,
        3,
        1,
        4,
        1,
        5,
        2,
        1,
    ]
    by_bytes = TextData(kind="text", path=str(tmp_path / "d.jsonl"))
    tokens, ends = _load_tokens(by_bytes, 256, 0, DataAccess.of([tmp_path], None))
    assert bytes(tokens) == b"a b\0c\0d a\0"
    assert ends.tolist() == [4, 6, 10]  # type: ignore[union-attr]


def test_the_worker_reads_only_what_access_allows_and_checks_every_id(tmp_path: Path) -> None:
    """The API reads a token file's head only; the worker refuses a file swapped for a link
    out of the roots, and an id past the vocabulary anywhere in the file."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    access = DataAccess.of([root], tmp_path / "state")
    ids = np.arange(100_000, dtype=np.uint32) % 1000
    ids[-1] = 5000  # past a 1000-token vocabulary, in the tail only
    ids.tofile(outside / "t.bin")
    (root / "t.bin").symlink_to(outside / "t.bin")
    data = TokenData(kind="tokens", path=str(root / "t.bin"), dtype="uint32")
    with pytest.raises(InvalidSpec, match="outside the data roots"):
        TokenStream.open(data, 1000, 32, seed=0, access=access)
    (root / "t.bin").unlink()
    ids.tofile(root / "t.bin")
    with pytest.raises(
        ValueError,
        match=r"token id at or above the model.s vocab_size 1000 \(the first at position 99999\)",
    ):
        TokenStream.open(data, 1000, 32, seed=0, access=access)


def _positions(tmp_path: Path, shuffle: bool = True) -> tuple[TokenData, np.ndarray]:
    """A token file whose every id is its own position: a batch names the sequences it
    read (input row i starts at sequence index x[i, 0] // seq_len)."""
    ids = np.arange(32 * 50 + 7, dtype=np.uint32)  # 50 sequences of 32 and a ragged tail
    ids.tofile(tmp_path / "pos.bin")
    return TokenData(kind="tokens", path=str(tmp_path / "pos.bin"), dtype="uint32"), ids


def _seen(stream: TokenStream, step: int, rounds: int, micro_batch: int) -> list[int]:
    rows = []
    for r in range(rounds):
        x, y = stream.batch(step, r, micro_batch)
        assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y[:, -1], x[:, -1] + 1)
        rows += (x[:, 0] // 32).tolist()
    return rows


def test_each_epoch_visits_every_sequence_once_in_the_documented_order(tmp_path: Path) -> None:
    """global_batch 8 over 50 sequences: steps cross epoch boundaries; the job is stopped
    mid-epoch at step 9 and a new stream (a resumed worker) carries on from step 9."""
    data, _ = _positions(tmp_path)
    first = TokenStream.open(data, 1 << 20, 32, seed=5, global_batch=8)
    assert first.sequences == 50  # (N - 1) // seq_len: the last input's label is in the tail
    seen = [s for step in range(9) for s in _seen(first, step, rounds=4, micro_batch=2)]
    resumed = TokenStream.open(data, 1 << 20, 32, seed=5, global_batch=8)
    seen += [s for step in range(9, 25) for s in _seen(resumed, step, rounds=2, micro_batch=4)]
    assert len(seen) == 25 * 8 == 4 * 50
    for epoch in range(4):
        visited = seen[epoch * 50 : (epoch + 1) * 50]
        assert sorted(visited) == list(range(50))  # each sequence exactly once
        assert visited == np.random.default_rng([5, epoch]).permutation(50).tolist()
    assert seen[:50] != seen[50:100]  # a new order each epoch
    assert first.epochs_done(25) == 4.0


def test_a_plan_never_changes_which_sequences_a_step_trains_on(tmp_path: Path) -> None:
    data, _ = _positions(tmp_path)
    stream = TokenStream.open(data, 1 << 20, 32, seed=1, global_batch=8)
    for step in (0, 6, 7, 13):
        one = _seen(stream, step, rounds=1, micro_batch=8)
        assert _seen(stream, step, rounds=4, micro_batch=2) == one
        assert _seen(stream, step, rounds=8, micro_batch=1) == one
    with pytest.raises(ValueError, match="global_batch=8"):
        stream.batch(0, 2, 4)  # 3 rounds of 4 is not 8


def test_without_shuffle_the_file_order_is_kept(tmp_path: Path) -> None:
    data, _ = _positions(tmp_path)
    stream = TokenStream.open(data, 1 << 20, 32, seed=1, global_batch=8, shuffle=False)
    seen = [s for step in range(7) for s in _seen(stream, step, rounds=2, micro_batch=4)]
    assert seen == list(range(50)) + list(range(6))


def test_documents_give_positions_within_documents_and_their_indices(tmp_path: Path) -> None:
    """Byte JSONL documents of 3, 6 and 9 bytes (+ NUL each): ends 4, 11, 21."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(f'{{"text": "{"x" * n}"}}\n' for n in (3, 6, 9, 2, 30)))
    data = TextData(kind="text", path=str(docs))
    stream = TokenStream.open(data, 256, 8, 0, global_batch=2, shuffle=False)
    np.testing.assert_array_equal(stream.doc_ends[:3], [4, 11, 21])  # type: ignore[index]
    pos, seg = stream.documents(0, 0, 2)  # sequences at tokens 0..7 and 8..15
    # the second starts inside document 1 (tokens 4..10): nothing before token 8 is visible
    # to it, so that document's positions restart at 0 there
    assert pos.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 2, 0, 1, 2, 3, 4]]
    assert seg.tolist() == [[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]]


def test_the_workers_errors_never_quote_its_files(tmp_path: Path) -> None:
    """A tokenizer.json the tokenizers library refuses and a JSONL line that is no object
    are named by field and line, never by their contents (the worker's error becomes the
    job's `error`, which the API shows)."""
    access = DataAccess.of([tmp_path], None)
    (tmp_path / "tok.json").write_text('{"model": {"type": "MARKER-tok-1"}}')
    (tmp_path / "d.jsonl").write_text('{"text": "fine"}\n["MARKER-doc-1"]\n')
    (tmp_path / "d.txt").write_text("fine")
    cases = [
        (TextData(kind="text", path=str(tmp_path / "d.txt"), tokenizer=str(tmp_path / "tok.json")),
         "is not a tokenizer.json the tokenizers library can load"),
        (TextData(kind="text", path=str(tmp_path / "d.jsonl")),
         "line 2 is not a JSON object with a 'text' string"),
    ]  # fmt: skip
    for data, needle in cases:
        with pytest.raises(ValueError, match=needle) as caught:
            TokenStream.open(data, 256, 4, seed=0, access=access)
        assert "MARKER" not in str(caught.value), str(caught.value)
