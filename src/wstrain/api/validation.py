"""Submission-time checks a JobSpec must pass beyond its schema: the model resolves, data
files exist under the configured data roots (outside the state dir) and fit the model, the
budgets fit some node (or the chip a plan is asked for: gpu_node), and a plan exists. Each
failure raises InvalidSpec/InfeasibleBudget with the fix.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import OrderedDict

import numpy as np

from wstrain.contracts.access import TOKENIZER_MAX_BYTES, DataAccess
from wstrain.contracts.calibration import GIB
from wstrain.contracts.chips import GpuName
from wstrain.contracts.documents import END_OF_TEXT_TOKENS, documents
from wstrain.contracts.errors import InvalidSpec
from wstrain.contracts.hardware import DEFAULT_PROFILE, SHIPPED_PROFILES, NodeProfile
from wstrain.contracts.jobs import GPUInfo, Node
from wstrain.contracts.model_dims import ModelDims, resolve_dims
from wstrain.contracts.model_refs import PathModel
from wstrain.contracts.plan import Plan
from wstrain.contracts.spec import JobSpec, SyntheticData, TextData, TokenData
from wstrain.contracts.token_file import (
    RAW_TEXT_MAX_BYTES,
    TokenFileHeader,
    document_span,
    index_path,
    prepare_command,
    token_dtype,
)
from wstrain.planning.planner import make_plan

_TOKEN_BYTES = {"uint16": 2, "uint32": 4}
# token ids checked on submit: 8 MiB of uint32 reads in ~2 ms; wrong-tokenizer files show in
# their first ids, and the worker checks the rest
HEAD_TOKENS = 1 << 21
# documents whose lengths price a document_mask job's attention on submit: 35 ms of Python
# on the dev VM, and on a million random lengths within 0.1% of the span of all of them,
# which the agent reads before the job runs (agent/launch.py)
SUBMIT_SPAN_DOCUMENTS = 1 << 16


def _check_tokens(
    data: TokenData, path: str, vocab_size: int, seq_len: int, access: DataAccess
) -> tuple[int, TokenFileHeader | None]:
    """dtype, length and the head's token ids of a .bin (raw or prepared) or .npy token file
    (`path`: the one data.path opened, /proc/self/fd/N); its length and its header (None
    for a bare file). Only the first HEAD_TOKENS ids are read here, so a submission costs
    the same for a 2 GiB file as for a small one; the worker checks every id before it
    trains (worker/io/data.py). Errors name positions and bounds, never ids or header values."""
    header = None
    if data.path.endswith(".npy"):
        try:
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, TypeError, OSError, EOFError):  # numpy's quote the header
            raise InvalidSpec(
                f"data.path={data.path!r} is not a readable .npy file (its header or size "
                "does not parse); save it with numpy.save"
            ) from None
        # a plain numeric dtype's name ("float32") is from a closed set; a structured one's
        # field names are the file's own text
        plain = tokens.dtype.names is None and tokens.dtype.kind in "biuf"
        if data.dtype is not None and tokens.dtype != np.dtype(data.dtype):
            raise InvalidSpec(
                f"data.path={data.path!r} holds "
                + (f"{tokens.dtype} tokens" if plain else "tokens of a non-numeric dtype")
                + f" but data.dtype={data.dtype!r}; set data.dtype to match (uint16 or "
                "uint32) or convert the file"
            )
        if not plain:
            raise InvalidSpec(
                f"data.path={data.path!r} holds tokens of a non-numeric dtype; save uint16 "
                "or uint32 token ids"
            )
        tokens = tokens.reshape(-1)
    else:
        try:
            dtype, header = token_dtype(data.path, data.dtype, access)
        except ValueError as exc:
            raise InvalidSpec(f"data.path: {exc}") from exc
        size, width = os.stat(path).st_size, _TOKEN_BYTES[dtype]
        if size % width or (header is not None and size != header.tokens * width):
            raise InvalidSpec(
                f"data.path={data.path!r} has {size} bytes, not "
                + (
                    f"a multiple of {width}"
                    if header is None
                    else f"{width} for each of the tokens as its header says; prepare it again"
                )
                + f"; is the dtype {dtype!r} right?"
            )
        if header is not None and header.vocab_size > vocab_size:
            raise InvalidSpec(
                f"data.path={data.path!r} was made with a tokenizer larger than the model's "
                f"vocab_size {vocab_size} (its header says so); use a model with a larger "
                "vocabulary or prepare the data with its tokenizer"
            )
        if size < (seq_len + 1) * width:  # and numpy cannot map an empty file
            raise InvalidSpec(
                f"data.path={data.path!r} holds {size // width} tokens, fewer than "
                f"one sequence of seq_len+1={seq_len + 1}"
            )
        tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
    if len(tokens) < seq_len + 1:
        raise InvalidSpec(
            f"data.path={data.path!r} holds {len(tokens)} tokens, fewer than "
            f"one sequence of seq_len+1={seq_len + 1}"
        )
    head = tokens[:HEAD_TOKENS]
    if int(head.max()) >= vocab_size:
        at = int(np.argmax(head >= vocab_size))
        raise InvalidSpec(
            f"data.path={data.path!r} holds a token id at or above the model's vocab_size "
            f"{vocab_size} (the first at position {at}); use a model with a larger "
            "vocabulary or the tokenizer the file was made with"
        )
    return len(tokens), header


def _check_index(data: TokenData, header: TokenFileHeader, access: DataAccess) -> None:
    """The document index beside a prepared token file matches its header: one uint64 end a
    document, the last one the token count (as `wstrain prepare` writes it). Two reads of
    8 bytes, whatever the index's size; the index's own values are never shown."""
    with access.descriptor(index_path(data.path), "data.path's index") as fd:
        size = os.fstat(fd).st_size
        last = os.pread(fd, 8, size - 8) if size >= 8 else b""
    if size != 8 * header.documents or int.from_bytes(last, sys.byteorder) != header.tokens:
        raise InvalidSpec(
            f"data.path={data.path!r}: its index (NAME.idx) does not match its header (one "
            "end offset a document, the last the token count); prepare the file again with "
            "`wstrain prepare`, or set document_mask: false"
        )


def _check_jsonl(data: TextData, path: str) -> None:
    """Every line a JSON object whose `text_field` is a string (`path`: data.path opened)."""
    try:
        for _ in documents(path, data.text_field, name=data.path):
            pass
    except ValueError as exc:
        raise InvalidSpec(f"data.path: {exc}; fix the line or set data.text_field") from exc


def _tokenizer_vocab(data: TextData, access: DataAccess) -> tuple[int, set[str]]:
    """The size and the special tokens of data.tokenizer (a tokenizers tokenizer.json), read
    whole under TOKENIZER_MAX_BYTES; errors name what is missing, never the file's text."""
    raw = access.read_bytes(
        data.tokenizer,
        "data.tokenizer",
        TOKENIZER_MAX_BYTES,
        fix='give the tokenizer.json the data was made with, or "byte"',
    )
    bad = f"data.tokenizer={data.tokenizer!r} is not a tokenizers tokenizer.json"
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:  # its msg is a fixed phrase, with no input in it
        raise InvalidSpec(f"{bad} ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except (ValueError, RecursionError):  # not UTF-8, huge numbers, deep nesting
        raise InvalidSpec(f"{bad} (not UTF-8 JSON Python can read)") from None
    try:
        vocab = len(parsed["model"]["vocab"])
        specials = {t["content"] for t in parsed.get("added_tokens", [])}
    except (KeyError, TypeError, AttributeError):
        raise InvalidSpec(
            f"{bad} (it needs model.vocab and added_tokens[].content); save it with "
            "tokenizer.save()"
        ) from None
    return vocab, {t for t in specials if isinstance(t, str)}


def _check_data(spec: JobSpec, dims: ModelDims, access: DataAccess) -> None:
    data = spec.data
    if spec.document_mask and isinstance(data, SyntheticData):
        raise InvalidSpec("document_mask: synthetic data has no documents; set it false")
    if isinstance(data, TokenData):
        with access.open(data.path, "data.path") as path:  # by descriptor, checked
            count, header = _check_tokens(data, path, dims.vocab_size, spec.seq_len, access)
        if spec.document_mask and (header is None or not header.documents):
            raise InvalidSpec(
                f"document_mask: data.path={data.path!r} has no document index (NAME.idx "
                "with its NAME.json header); make the file with `wstrain prepare`, or set "
                "document_mask: false"
            )
        if spec.document_mask and header is not None:
            _check_index(data, header, access)
        held_out = int(count * spec.eval.heldout_fraction) if spec.eval else None
        if held_out is not None and held_out < spec.seq_len + 1:
            raise InvalidSpec(
                f"eval.heldout_fraction={spec.eval.heldout_fraction} of "  # type: ignore[union-attr]
                f"{count} tokens leaves {held_out}, fewer than one sequence of "
                f"seq_len+1={spec.seq_len + 1}; raise the fraction or use more data"
            )
    if isinstance(data, TextData):
        with access.open(data.path, "data.path") as path:  # by descriptor, checked
            size = os.stat(path).st_size
            if size > RAW_TEXT_MAX_BYTES:
                command = prepare_command(data.path, data.tokenizer, data.text_field)
                raise InvalidSpec(
                    f"data.path={data.path!r} is {size / 2**20:.0f} MiB of raw text, over the "
                    f"{RAW_TEXT_MAX_BYTES >> 20} MiB a job tokenizes at its start; make a "
                    f"token file once, on all cores: `{command}`, and submit data: "
                    "{kind: tokens, path: ...bin}"
                )
            if data.path.endswith(".jsonl"):
                _check_jsonl(data, path)
        vocab, specials = 256, set[str]()
        if data.tokenizer != "byte":
            vocab, specials = _tokenizer_vocab(data, access)
            if data.path.endswith(".jsonl") and not specials & set(END_OF_TEXT_TOKENS):
                raise InvalidSpec(
                    f"data.tokenizer={data.tokenizer!r} has none of the "
                    f"end-of-text tokens {list(END_OF_TEXT_TOKENS)} that packing "
                    "JSONL documents needs; add one to the tokenizer"
                )
        if vocab > dims.vocab_size:
            raise InvalidSpec(
                f"the tokenizer has {vocab} tokens but the model's vocab_size is "
                f"{dims.vocab_size}; use a model with vocab_size >= {vocab}"
            )


def pick_node(spec: JobSpec, nodes: list[Node]) -> NodeProfile:
    """The node profile to plan with: the largest node that could hold the budgets."""
    if not nodes:
        return DEFAULT_PROFILE
    profiles = [
        NodeProfile.from_profile(
            n.device,
            n.profile,
            max((g.total_bytes for g in n.gpus), default=n.host_total_bytes),
            n.host_total_bytes,
        )
        for n in nodes
    ]
    fits = [
        p
        for p in profiles
        if p.device_total_bytes >= spec.budget.device_bytes
        and p.host_total_bytes >= spec.budget.host_bytes
    ]
    if not fits:
        dev = max(p.device_total_bytes for p in profiles) / GIB
        host = max(p.host_total_bytes for p in profiles) / GIB
        raise InvalidSpec(
            f"budget device_gib={spec.budget.device_gib}, host_gib={spec.budget.host_gib} is "
            f"larger than any node has (largest device {dev:.1f} GiB, largest host "
            f"{host:.1f} GiB); lower the budgets"
        )
    return max(fits, key=lambda p: p.matmul_flops)


def gpu_node(spec: JobSpec, gpu: GpuName) -> tuple[Node, str]:
    """A node of `spec.gpus` `gpu`s with wstrain's shipped profile for that chip
    (contracts/hardware.py), to plan `spec` for a chip no node of the queue has (POST
    /v1/plans?gpu=), and the note the plan carries that says so. Its host is the profile's
    or the spec's host budget, whichever is larger: the chip is what is asked about."""
    shipped = SHIPPED_PROFILES[gpu]
    if spec.budget.device_bytes > shipped.device_total_bytes:
        larger = [
            f"{name} ({p.device_total_bytes / GIB:.1f} GiB)"
            for name, p in SHIPPED_PROFILES.items()
            if p.device_total_bytes >= spec.budget.device_bytes
        ]
        raise InvalidSpec(
            f"budget device_gib={spec.budget.device_gib} is more than one {shipped.label} "
            f"holds ({shipped.device_total_bytes / GIB:.1f} GiB); lower it"
            + (f", or plan for a larger chip: --gpu {', '.join(larger)}" if larger else "")
        )
    host_bytes = max(shipped.host_total_bytes, spec.budget.host_bytes)
    gpus = [
        GPUInfo(
            index=i,
            name=shipped.label,
            total_bytes=shipped.device_total_bytes,
            free_bytes=shipped.device_total_bytes,
        )
        for i in range(spec.gpus)
    ]
    node = Node(
        name=f"gpu:{gpu}",
        device="cuda",
        gpus=gpus,
        host_total_bytes=host_bytes,
        host_free_bytes=host_bytes,
        slots=spec.gpus,
        running=[],
        profile=dict(shipped.profile),
        heartbeat_at=0.0,
    )
    return node, shipped.note


def validate_and_plan(spec: JobSpec, nodes: list[Node], access: DataAccess) -> Plan:
    if isinstance(spec.model, PathModel):  # the directory opened and checked, then listed
        with access.descriptor(spec.model.path, "model.path", directory=True) as fd:
            weights = any(name.endswith(".safetensors") for name in os.listdir(fd))
        if not weights:
            raise InvalidSpec(
                f"model.path={spec.model.path!r} holds no *.safetensors weights "
                "to fine-tune; save the model with save_pretrained (safetensors), "
                'or name {"hf_config": ...} to train from scratch'
            )
    dims = resolve_dims(spec.model, access)  # config.json by descriptor, capped
    _check_data(spec, dims, access)
    node = pick_node(spec, nodes)
    if spec.document_mask and isinstance(spec.data, TokenData):  # _check_data: it has an index
        try:  # the index by descriptor, under a root too
            span = document_span(spec.data.path, spec.seq_len, SUBMIT_SPAN_DOCUMENTS, access)
        except OSError as exc:
            raise InvalidSpec(
                f"data.path={spec.data.path!r}: its document index cannot be read "
                f"({exc.strerror}); "
                "prepare the file again with `wstrain prepare`, or set document_mask: false"
            ) from exc
        node = node.with_documents(span)  # long sequences' pieces cost their documents
    return _plan(spec, dims, node)


# Plans already made, by (spec less its name, node profile): a sweep of jobs that differ in
# name only plans once. Planning is 10-75 ms of CPU a spec; under bench/api_load.py's mix it
# was a quarter of the API's CPU, for a tenth of the requests. In the API each planner
# process (api/planning.py) keeps its own: the last process to finish plans next, so one
# owner's sweep, which plans one spec at a time, stays on the process that holds its plan.
_PLANS: OrderedDict[tuple[str, NodeProfile], Plan] = OrderedDict()
_PLANS_MAX = 256
_PLANS_LOCK = threading.Lock()  # callers outside the API (tests, bench/) plan in threads


def _plan(spec: JobSpec, dims: ModelDims, node: NodeProfile) -> Plan:
    key = (spec.model_dump_json(exclude={"name"}), node)
    with _PLANS_LOCK:
        cached = _PLANS.get(key)
        if cached is not None:
            _PLANS.move_to_end(key)
            return cached.model_copy(deep=True)  # the caller may annotate its copy
    plan = make_plan(spec, dims, node)  # a refusal (InfeasibleBudget) raises, uncached
    with _PLANS_LOCK:
        _PLANS[key] = plan.model_copy(deep=True)
        while len(_PLANS) > _PLANS_MAX:
            _PLANS.popitem(last=False)
    return plan
