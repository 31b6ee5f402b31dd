"""Token files read the same whether raw (.bin) or .npy, and the batch order is a pure
function of (seed, step, round), so a resumed run continues with exactly the next batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from wstrain.scheduler.contracts.access import DataAccess
from wstrain.scheduler.contracts.errors import InvalidSpec
from wstrain.scheduler.contracts.jobs import TokenData
from wstrain.worker.io.data import TokenStream


def test_bin_and_npy_token_files_give_the_same_batches(tmp_path: Path) -> None:
    ids = (np.arange(10_000) * 7919 % 50_000).astype(np.uint32)
    ids.tofile(tmp_path / "t.bin")
    np.save(tmp_path / "t.npy", ids)
    streams = [
        TokenStream.open(
            TokenData(kind="tokens", path=str(tmp_path / f), dtype="uint32"), 50_000, 64, seed=3
        )
        for f in ("t.bin", "t.npy")
    ]
    for step, rnd in ((0, 0), (5, 1), (5, 1)):
        (xa, ya), (xb, yb) = (s.batch(step, rnd, 4) for s in streams)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert xa.shape == (4, 64) and torch.equal(xa[:, 1:], ya[:, :-1])
    again = TokenStream.open(
        TokenData(kind="tokens", path=str(tmp_path / "t.bin"), dtype="uint32"), 50_000, 64, seed=3
    )
    assert torch.equal(again.batch(7, 2, 4)[0], streams[0].batch(7, 2, 4)[0])
    assert not torch.equal(streams[0].batch(7, 2, 4)[0], streams[0].batch(8, 2, 4)[0])


def test_heldout_split_is_kept_out_of_training(tmp_path: Path) -> None:
    ids = np.arange(20_000, dtype=np.uint32)  # every id names its position
    ids.tofile(tmp_path / "t.bin")
    data = TokenData(kind="tokens", path=str(tmp_path / "t.bin"), dtype="uint32")
    stream = TokenStream.open(data, 20_000, 32, seed=0, heldout_fraction=0.1)
    for step in range(50):
        _, y = stream.batch(step, 0, 4)
        assert int(y.max()) < 18_000  # training never reads the held-out tail
    ex, ey = stream.eval_batch(6)
    assert int(ex.min()) >= 18_000 and torch.equal(ex[:, 1:], ey[:, :-1])
    assert torch.equal(stream.eval_batch(6)[0], ex)  # the same sequences every time


def _tokenizer_json(path: Path) -> Path:
    """A word-level tokenizers tokenizer with an end-of-text special token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", "a", "b", "c", "d"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path / "tokenizer.json"))
    return path / "tokenizer.json"


def test_jsonl_documents_are_packed_with_end_of_text(tmp_path: Path) -> None:
    from wstrain.scheduler.contracts.jobs import TextData
    from wstrain.worker.io.data import _load_tokens

    (tmp_path / "d.jsonl").write_text(
        '{"text": "a b"}\n\n{"text": "c", "id": 2}\n{"body": "d a", "text": "d a"}\n'
    )
    tok = _tokenizer_json(tmp_path)
    data = TextData(kind="text", path=str(tmp_path / "d.jsonl"), tokenizer=str(tok))
    assert _load_tokens(data, 6, 0, DataAccess.of([tmp_path], None)).tolist() == [
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
    assert (
        bytes(_load_tokens(by_bytes, 256, 0, DataAccess.of([tmp_path], None))) == b"a b\0c\0d a\0"
    )


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
    with pytest.raises(ValueError, match=r"token id 5000 .*position 99999.* vocab_size is 1000"):
        TokenStream.open(data, 1000, 32, seed=0, access=access)
