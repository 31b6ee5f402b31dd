"""No answer of the API holds a byte of a file a user named, and files the API parses whole
are capped, against a real uvicorn and a real Redis.

Every file the API can be pointed at (a model directory's config.json, valid and broken,
with markers as values and as keys, symlinked out of the data roots; tokenizer.json; a
token file, its header and its index; a .npy; JSONL and text) holds a marker string
("MARKER-<kind>-<n>") that no request carries. Many specs naming them, valid and broken,
go to POST /v1/jobs and POST /v1/plans, and every answer (and every created job as
GET /v1/jobs/ID shows it) is searched for the markers. A 2 GiB sparse config.json and
tokenizer.json answer 422 naming the cap at once, and the API's memory does not grow.

    pytest tests/api/test_file_leaks.py
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import Stack, tiny_spec
from wstrain.contracts.access import (
    CONFIG_MAX_BYTES,
    TOKEN_HEADER_MAX_BYTES,
    TOKENIZER_MAX_BYTES,
)

_SERIAL = itertools.count()
GOOD_CONFIG = {
    "vocab_size": 256,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
SPARSE_BYTES = 2 << 30  # a 2 GiB file that takes no disk: only its size is real
# the API's resident memory may grow this much over the whole test (allocator noise, the
# plan cache); reading one 2 GiB file whole would take 2 GiB
RSS_GROWTH_MAX_BYTES = 200 << 20
ANSWER_MAX_S = 2.0  # an over-cap file answers at once; reading 2 GiB would take seconds


def mark(kind: str) -> str:
    return f"MARKER-{kind}-{next(_SERIAL)}"


# numbers planted where only a number fits: an id past the vocabulary, a config value
NUMBER_MARKERS = ("61017", "12345.678")
# each as a number of its own: inside a longer one (a job's predicted seconds, 16 digits;
# a timestamp's microseconds) a 5-digit run turns up by chance among a 23-job listing's
# thousands of digits
_NUMBER_LEAK = re.compile("|".join(rf"(?<![\d.]){re.escape(n)}(?!\d)" for n in NUMBER_MARKERS))


def _leaks(text: str) -> bool:
    # the whole marker, or a part that an excerpt or a cut-off message would keep
    return any(part in text for part in ("MARKER", "ARKER-", "marker-")) or bool(
        _NUMBER_LEAK.search(text)
    )


def _model_dir(root: Path, name: str, config: bytes | None) -> Path:
    """A model directory with weights (their bytes a marker too) and `config` as its
    config.json (None: none written, the caller makes it)."""
    d = root / name
    d.mkdir()
    (d / "model.safetensors").write_bytes(mark("weights").encode() * 4)
    if config is not None:
        (d / "config.json").write_bytes(config)
    return d


def _sparse(path: Path, size: int = SPARSE_BYTES) -> Path:
    with open(path, "wb") as f:
        f.write(b'{"' + mark("sparse").encode() + b'": 1, ')  # its head is a marker too
        f.truncate(size)
    return path


@pytest.fixture(scope="module")
def files(api_only: Stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The planted files: under a data root, except `outside` (a symlink target)."""
    root = api_only.state_dir.parent / "leaks"
    root.mkdir()
    outside = tmp_path_factory.mktemp("outside-the-roots")
    f: dict[str, Path] = {}

    def cfg(name: str, body: object | bytes) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        f[name] = _model_dir(root, name, raw)

    # config.json: broken JSON, markers as values of every type-checked field, as keys,
    # inside nested RoPE settings, as a list, not UTF-8, nested past the stack
    cfg("cfg-json", b'{"' + mark("cfgkey").encode() + b'": "' + mark("cfgval").encode() + b'", ')
    cfg("cfg-values", {k: mark("cfgval") for k in GOOD_CONFIG} | {"model_type": mark("cfgval")})
    cfg("cfg-keys-bad", {mark("cfgkey"): mark("cfgval"), "vocab_size": 256})
    cfg("cfg-keys-good", {**GOOD_CONFIG, mark("cfgkey"): mark("cfgval")})  # valid: 200
    cfg("cfg-rope", {**GOOD_CONFIG, "rope_scaling": {"rope_type": mark("rope")}})
    llama3 = {"rope_type": "llama3", "factor": mark("rope"), "low_freq_factor": 1}
    llama3 |= {"high_freq_factor": 4, "original_max_position_embeddings": 64}
    cfg("cfg-rope-factor", {**GOOD_CONFIG, "rope_parameters": llama3})
    cfg("cfg-heads", {**GOOD_CONFIG, "num_attention_heads": 3, mark("cfgkey"): 1})
    cfg("cfg-clip", {**GOOD_CONFIG, "clip_qkv": 12345.678, "pad_token_id": 255})
    cfg("cfg-list", [mark("cfgval"), GOOD_CONFIG])
    cfg("cfg-utf8", b'{"vocab_size": "\xff\xfe' + mark("cfgval").encode() + b'"}')
    cfg("cfg-deep", b"[" * 50_000 + mark("cfgval").encode())
    cfg("cfg-bigint", b'{"vocab_size": 1' + b"0" * 5000 + b', "x": "' + mark("cfgval").encode())
    # a symlink out of the roots, to a valid and to a broken config.json
    for name, body in (("good", GOOD_CONFIG), ("bad", {**GOOD_CONFIG, "vocab_size": "x"})):
        target = outside / f"{name}.json"
        target.write_text(json.dumps({**body, "secret": "sk-" + mark("outside")}))
        f[f"cfg-link-{name}"] = _model_dir(root, f"cfg-link-{name}", None)
        (f[f"cfg-link-{name}"] / "config.json").symlink_to(target)
    (outside / "model").mkdir()
    (outside / "model" / "config.json").write_text(json.dumps(GOOD_CONFIG | {"a": mark("o")}))
    (outside / "model" / "model.safetensors").write_text(mark("outside"))
    (root / "dir-link").symlink_to(outside / "model")  # the whole directory outside
    f["dir-link"] = root / "dir-link"
    f["cfg-sparse"] = _model_dir(root, "cfg-sparse", None)
    _sparse(f["cfg-sparse"] / "config.json")
    f["cfg-fifo"] = _model_dir(root, "cfg-fifo", None)
    os.mkfifo(f["cfg-fifo"] / "config.json")  # an open of it would wait for a writer
    f["cfg-good"] = _model_dir(root, "cfg-good", json.dumps(GOOD_CONFIG).encode())

    # tokenizer.json
    def tok(name: str, body: object | bytes) -> None:
        f[name] = root / f"{name}.json"
        f[name].write_bytes(body if isinstance(body, bytes) else json.dumps(body).encode())

    vocab = {mark("vocab"): i for i in range(250)}
    eos = [{"id": 250, "content": "<|endoftext|>"}]
    tok("tok-json", b'{"' + mark("tok").encode() + b'": [')
    tok("tok-shape", {"model": {"vocab": mark("tok")}, "added_tokens": [{"content": {"a": 1}}]})
    tok("tok-nomodel", {mark("tokkey"): {"vocab": 1}})
    tok("tok-no-eos", {"model": {"vocab": vocab}, "added_tokens": [{"content": mark("tok")}]})
    tok("tok-too-big", {"model": {"vocab": {mark("v"): i for i in range(300)}}})
    tok("tok-good", {"model": {"vocab": vocab}, "added_tokens": eos})  # valid: 200
    tok("tok-utf8", b'{"model": "\xff' + mark("tok").encode() + b'"}')
    f["tok-sparse"] = _sparse(root / "tok-sparse.json")
    (outside / "tok.json").write_text(json.dumps({"model": {"vocab": vocab}, "m": mark("o")}))
    (root / "tok-link.json").symlink_to(outside / "tok.json")
    f["tok-link"] = root / "tok-link.json"

    # token files: ids that spell a marker; headers broken, with marker values and keys,
    # too large, linked out; an index of marker bytes; .npy with a marker in its header
    ids = np.arange(4096, dtype=np.uint16) % 256
    header = {
        "complete": True,
        "dtype": "uint16",
        "tokens": len(ids),
        "documents": 4,
        "vocab_size": 256,
        "eos_id": 0,
        "tokenizer": "byte",
        "tokenizer_sha256": "",
        "source": "s",
        "source_bytes": 1,
        "text_field": "text",
        "chunk_bytes": 1,
    }

    def tokens(name: str, head: object | bytes | None, data: bytes | None = None) -> None:
        f[name] = root / f"{name}.bin"
        f[name].write_bytes(data if data is not None else ids.tobytes())
        index = mark("index").encode().ljust(32, b"-")  # 4 uint64 ends of nonsense
        f[name].with_suffix(".idx").write_bytes(index)
        if head is not None:
            raw = head if isinstance(head, bytes) else json.dumps(head).encode()
            f[name].with_suffix(".json").write_bytes(raw)

    spelled = np.frombuffer((mark("ids") * 400).encode()[:8192], dtype=np.uint16).tobytes()
    tokens("bin-spelled", None, spelled)  # a bare file whose ids are a marker's bytes
    big_id = ids.copy()
    big_id[1000] = 61017  # a distinctive id past the vocabulary: the answer gives its position
    tokens("bin-big-id", None, big_id.tobytes())
    tokens("hdr-json", b'{"' + mark("hdr").encode() + b'": ')
    tokens("hdr-values", {**header, "dtype": mark("hdr"), "format": mark("hdr")})
    tokens("hdr-key", {**header, mark("hdrkey"): 1})
    tokens("hdr-vocab", {**header, "vocab_size": 50_000, "tokenizer": mark("hdr")})
    tokens("hdr-count", {**header, "tokens": 4097, "source": mark("hdr")})
    tokens("hdr-incomplete", {**header, "complete": False, "source": mark("hdr")})
    tokens("hdr-good", {**header, "source": mark("hdr"), "tokenizer": mark("hdr")})  # 200
    tokens("hdr-sparse", None)
    _sparse(f["hdr-sparse"].with_suffix(".json"), 1 << 30)
    tokens("hdr-link", None)
    (outside / "hdr.json").write_text(json.dumps({**header, "source": mark("o")}))
    f["hdr-link"].with_suffix(".json").symlink_to(outside / "hdr.json")
    tokens("idx-link", {**header, "source": mark("hdr")})
    f["idx-link"].with_suffix(".idx").unlink()
    (outside / "idx.idx").write_bytes(mark("o").encode().ljust(32, b"-"))
    f["idx-link"].with_suffix(".idx").symlink_to(outside / "idx.idx")
    structured = np.zeros(4096, dtype=[(mark("npy"), "<u2")])
    f["npy-structured"] = root / "npy-structured.npy"
    np.save(f["npy-structured"], structured)
    f["npy-header"] = root / "npy-header.npy"
    bad_header = "{'descr': '" + mark("npy") + "', 'fortran_order': False, 'shape': (9,), }"
    raw = bad_header.encode().ljust(118) + b"\n"
    f["npy-header"].write_bytes(b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw)

    # JSONL and text
    def text(name: str, body: bytes) -> None:
        f[name] = root / name
        f[name].write_bytes(body)

    line = json.dumps({"text": mark("doc")}).encode() + b"\n"
    text("bad-line.jsonl", line + json.dumps({mark("jkey"): mark("doc")}).encode() + b"\n")
    text("not-object.jsonl", line + json.dumps([mark("doc")]).encode() + b"\n")
    text("broken.jsonl", line + b'{"text": "' + mark("doc").encode() + b"\n")
    text("utf8.jsonl", line + b'{"text": "\xff' + mark("doc").encode() + b'"}\n')
    text("deep.jsonl", line + b"[" * 50_000 + mark("doc").encode() + b"\n")
    text("good.jsonl", line * 200)  # valid: 200
    text("good.txt", (mark("text") + " ").encode() * 200)  # valid: 200
    return f


def _specs(f: dict[str, Path]) -> list[tuple[str, dict[str, Any], int, str]]:
    """(case, spec, expected status, a phrase the answer must hold)."""
    out: list[tuple[str, dict[str, Any], int, str]] = []

    def model(case: str, status: int, needle: str) -> None:
        out.append((case, tiny_spec(case, model={"path": str(f[case])}), status, needle))

    for case in ("cfg-json", "cfg-utf8", "cfg-deep", "cfg-bigint"):
        model(case, 422, "config.json is not")
    model("cfg-values", 422, "vocab_size")
    model("cfg-keys-bad", 422, "hidden_size: Field required")
    model("cfg-rope", 422, "rope_type is not supported")
    model("cfg-rope-factor", 422, "factor must be a positive number")
    model("cfg-heads", 422, "must be a multiple of num_key_value_heads")
    model("cfg-clip", 422, "clip_qkv is not supported")
    model("cfg-list", 422, "valid dictionary")
    model("cfg-link-good", 422, "outside the data roots")
    model("cfg-link-bad", 422, "outside the data roots")
    model("dir-link", 422, "outside the data roots")
    model("cfg-sparse", 422, f"cap ({CONFIG_MAX_BYTES} bytes)")
    model("cfg-fifo", 422, "not a regular file")
    model("cfg-keys-good", 200, "")
    model("cfg-good", 200, "")

    def tokenizer(case: str, data: str, status: int, needle: str) -> None:
        ref = {"kind": "text", "path": str(f[data]), "tokenizer": str(f[case])}
        out.append((case, tiny_spec(case, data=ref), status, needle))

    for case in ("tok-json", "tok-shape", "tok-nomodel", "tok-utf8"):
        tokenizer(case, "good.jsonl", 422, "is not a tokenizers tokenizer.json")
    tokenizer("tok-no-eos", "good.jsonl", 422, "none of the end-of-text tokens")
    tokenizer("tok-too-big", "good.txt", 422, "the tokenizer has 300 tokens")
    tokenizer("tok-link", "good.txt", 422, "outside the data roots")
    tokenizer("tok-sparse", "good.txt", 422, f"cap ({TOKENIZER_MAX_BYTES} bytes)")
    tokenizer("tok-good", "good.jsonl", 200, "")
    tokenizer("tok-good", "good.txt", 200, "")

    def data(case: str, status: int, needle: str, **over: Any) -> None:
        kind = "text" if case.endswith(("jsonl", "txt")) else "tokens"
        ref = {"kind": kind, "path": str(f[case])}
        ref |= {"tokenizer": "byte"} if kind == "text" else {}
        ref |= {"dtype": "uint16"} if case.startswith("bin-") else {}  # bare: no header
        out.append((case, tiny_spec(case, data=ref, **over), status, needle))

    data(
        "bin-spelled",
        422,
        "at or above the model's vocab_size 256",
    )
    data("bin-big-id", 422, "(the first at position 1000)")
    data("hdr-json", 422, "is not a wstrain token-file header")
    data("hdr-values", 422, "dtype: Input should be")
    data("hdr-key", 422, "a field the format does not have")
    data("hdr-vocab", 422, "larger than the model's vocab_size 256")
    data("hdr-count", 422, "as its header says")
    data("hdr-incomplete", 422, "run the same `wstrain prepare` again")
    data("hdr-sparse", 422, f"cap ({TOKEN_HEADER_MAX_BYTES} bytes)")
    data("hdr-link", 422, "outside the data roots")
    data("idx-link", 422, "outside the data roots", document_mask=True)
    data("hdr-good", 422, "does not match its header", document_mask=True)  # index: nonsense
    data("hdr-good", 200, "")
    data("npy-structured", 422, "non-numeric dtype")
    data("npy-header", 422, "is not a readable .npy file")
    for case in ("bad-line.jsonl", "not-object.jsonl", "broken.jsonl", "deep.jsonl"):
        data(case, 422, "line 2 is not a JSON object with a 'text' string")
    data("utf8.jsonl", 422, "line 2 is not UTF-8")
    data("good.jsonl", 200, "")
    data("good.txt", 200, "")
    return out


def _rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and of its children (the API's planner processes, which
    parse the files), summed."""
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total += int(line.split()[1]) * 1024
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(FileNotFoundError):  # it exited meanwhile
                total += _rss_bytes(int(child))
    return total


def test_no_answer_holds_a_byte_of_a_named_file(api_only: Stack, files: dict[str, Path]) -> None:
    rss_before = _rss_bytes(api_only.api.pid)
    seen: list[str] = []
    with api_only.client() as c:
        for case, spec, status, needle in _specs(files):
            assert not _leaks(json.dumps(spec)), f"{case}: the request itself holds a marker"
            for route in ("/v1/plans", "/v1/jobs"):
                start = time.monotonic()
                r = c.post(route, json=spec)
                took_s = time.monotonic() - start
                want = 201 if status == 200 and route == "/v1/jobs" else status
                assert r.status_code == want, (case, route, r.text)
                assert needle in r.text, (case, route, needle, r.text)
                assert not _leaks(r.text), (case, route, r.text)
                if "cap (" in needle:
                    assert took_s < ANSWER_MAX_S, (case, route, took_s)
                seen.append(r.text)
                if r.status_code == 201:
                    job = c.get(f"/v1/jobs/{r.json()['id']}")
                    assert job.status_code == 200 and not _leaks(job.text), (case, job.text)
                    c.post(f"/v1/jobs/{r.json()['id']}/cancel")
        listing = c.get("/v1/jobs", params={"limit": 200})
        assert listing.status_code == 200 and not _leaks(listing.text)
    assert len(seen) == 2 * len(_specs(files))
    grew = _rss_bytes(api_only.api.pid) - rss_before
    assert grew < RSS_GROWTH_MAX_BYTES, f"the API's RSS grew {grew >> 20} MiB"


def test_the_markers_would_be_found(files: dict[str, Path]) -> None:
    """The search finds what it looks for: every planted file (a token file with its header
    and index; a model directory's config.json and weights) holds a marker."""
    for name, path in files.items():
        if path.is_dir():
            planted = [p for p in path.iterdir() if p.is_file() and not p.is_fifo()]
        else:
            planted = [path] + [path.with_suffix(s) for s in (".json", ".idx")] * (
                path.suffix == ".bin"
            )
        heads = []
        for p in planted:
            if p.exists():
                with open(p, "rb") as f:
                    heads.append(f.read(1 << 20).decode("latin-1"))
        spelled = name == "bin-big-id" and 61017 in np.fromfile(path, np.uint16)
        assert spelled or any(_leaks(h) for h in heads), name


def test_an_inline_hf_config_still_names_its_values(api_only: Stack) -> None:
    """Values the user sent in the request itself are theirs to see: only files' are hidden."""
    hf = {**GOOD_CONFIG, "num_attention_heads": 3}
    with api_only.client() as c:
        r = c.post("/v1/plans", json=tiny_spec("inline", model={"hf_config": hf}))
    assert r.status_code == 422 and "num_attention_heads=3" in r.text, r.text
