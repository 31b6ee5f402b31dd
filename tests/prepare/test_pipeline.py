"""`wstrain prepare`: the token file holds exactly what tokenizing each document and
appending the end-of-text id gives, whatever the chunking and the number of workers; JSONL,
plain text, Parquet and a `datasets` directory; an interrupted run resumes to the same file;
a bad line is named; the worker reads the result with the header's dtype.

    pytest tests/prepare/test_pipeline.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.conftest import CORPUS, REPO
from wstrain.contracts.spec import TokenData
from wstrain.contracts.token_file import read_header, token_dtype
from wstrain.prepare.pipeline import PrepareRequest, prepare
from wstrain.worker.io.data import TokenStream


def _bpe(path: Path, vocab: int = 400) -> Path:
    """A byte-level BPE trained on the example corpus, with <|endoftext|>."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS.read_text()], trainer)
    tok.save(str(path))
    return path


def _docs(n: int = 600) -> list[str]:
    paragraphs = [p for p in CORPUS.read_text().split("\n\n") if p.strip()]
    return [paragraphs[(7 * i) % len(paragraphs)] * (1 + i % 3) for i in range(n)]


def _jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    return path


def _expected(tokenizer: Path, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id("<|endoftext|>")
    per_doc = [[*tok.encode(d).ids, eos] for d in docs]
    return np.concatenate(per_doc), np.cumsum([len(ids) for ids in per_doc])


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bpe(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.mark.parametrize(("workers", "chunk_bytes"), [(1, 1 << 20), (2, 4096), (3, 777)])
def test_the_token_file_is_each_document_tokenized_and_ended(
    tmp_path: Path, bpe: Path, workers: int, chunk_bytes: int
) -> None:
    docs = _docs()
    src = _jsonl(tmp_path / "docs.jsonl", docs)
    out = tmp_path / "out" / "docs.bin"
    header = prepare(PrepareRequest(str(src), str(out), str(bpe), "body", workers, chunk_bytes))
    ids, ends = _expected(bpe, docs)
    assert header.complete and header.dtype == "uint16" and header.vocab_size == 400
    assert (header.tokens, header.documents) == (len(ids), len(docs))
    np.testing.assert_array_equal(np.fromfile(out, np.uint16), ids)
    np.testing.assert_array_equal(np.fromfile(out.with_suffix(".idx"), np.uint64), ends)
    assert not out.with_suffix(".parts").exists()
    assert read_header(out) == header
    # the worker memory-maps it with the header's dtype; a wrong explicit dtype is refused
    stream = TokenStream.open(TokenData(kind="tokens", path=str(out)), 400, 16, 0)
    assert stream.tokens.dtype == np.uint16 and len(stream.tokens) == len(ids)
    with pytest.raises(ValueError, match=r"leave data\.dtype out"):
        token_dtype(out, "uint32")


def test_parquet_and_a_datasets_directory_give_the_jsonl_file(tmp_path: Path, bpe: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset

    docs = _docs(300)
    pq.write_table(pa.table({"body": docs}), tmp_path / "docs.parquet", row_group_size=70)
    Dataset.from_dict({"body": docs, "n": list(range(len(docs)))}).save_to_disk(
        str(tmp_path / "arrow")
    )
    ids, _ = _expected(bpe, docs)
    for src in ("docs.parquet", "arrow"):
        out = tmp_path / f"{src}.bin"
        prepare(PrepareRequest(str(tmp_path / src), str(out), str(bpe), "body", 2, 16 << 10))
        np.testing.assert_array_equal(np.fromfile(out, np.uint16), ids, err_msg=src)
    with pytest.raises(ValueError, match="no column 'text'"):
        prepare(PrepareRequest(str(tmp_path / "docs.parquet"), str(tmp_path / "x.bin")))


def test_plain_text_is_one_document(tmp_path: Path) -> None:
    out = tmp_path / "corpus.bin"
    header = prepare(PrepareRequest(str(CORPUS), str(out), "byte", chunk_bytes=5000, workers=2))
    raw = np.frombuffer(CORPUS.read_bytes(), np.uint8)
    np.testing.assert_array_equal(np.fromfile(out, np.uint16), np.append(raw, 0))
    assert header.documents == 1 and header.eos_id == 0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "wstrain.cli.main", "prepare", *args]


def test_a_killed_run_resumes_to_the_same_file(tmp_path: Path, bpe: Path) -> None:
    src = _jsonl(tmp_path / "docs.jsonl", _docs(12000))  # ~26 MB: 26 chunks of 1 MiB
    args = [str(src), str(tmp_path / "cut.bin"), "--tokenizer", str(bpe), "--text-field",
            "body", "--chunk-mib", "1", "--workers", "1"]  # fmt: skip
    parts = tmp_path / "cut.parts"
    proc = subprocess.Popen(_cli(*args), cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(parts.glob("*.bin")):  # the first whole part: the kill lands mid-run
        assert proc.poll() is None, "prepare ended before it could be cut off"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and its worker, mid-chunk
    proc.wait()
    header = read_header(tmp_path / "cut.bin")
    assert header is not None and not header.complete
    with pytest.raises(ValueError, match="run the same `wstrain prepare` again"):
        token_dtype(tmp_path / "cut.bin", None)
    kept = len(list(parts.glob("*.bin")))
    again = subprocess.run(_cli(*args), cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"resuming: {kept} of" in again.stderr
    whole = tmp_path / "whole.bin"
    prepare(PrepareRequest(str(src), str(whole), str(bpe), "body", 2, 1 << 20))
    assert (tmp_path / "cut.bin").read_bytes() == whole.read_bytes()
    assert (tmp_path / "cut.idx").read_bytes() == whole.with_suffix(".idx").read_bytes()


def test_a_bad_line_is_named_and_nothing_is_marked_complete(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "fine"}\n{"text": 3}\n')
    run = subprocess.run(_cli(str(src), str(tmp_path / "bad.bin")), cwd=REPO,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 1
    assert "line 2" in run.stderr and "'text' string" in run.stderr, run.stderr
    header = read_header(tmp_path / "bad.bin")
    assert header is not None and not header.complete
    (tmp_path / "tok.json").write_text("{not json")
    for args, needle in (
        (["--tokenizer", str(tmp_path / "tok.json")], "is not a tokenizers tokenizer.json"),
        (["--tokenizer", str(tmp_path / "none.json")], "No such file"),
    ):
        run = subprocess.run(_cli(str(src), str(tmp_path / "t.bin"), *args), cwd=REPO,
                             capture_output=True, text=True)  # fmt: skip
        assert run.returncode == 1 and needle in run.stderr, run.stderr
    run = subprocess.run(_cli(str(tmp_path / "absent.jsonl"), str(tmp_path / "t.bin")),
                         cwd=REPO, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 1 and "does not exist" in run.stderr, run.stderr
