"""Submission-time checks a JobSpec must pass beyond its schema: the model resolves, data
files exist under the configured data roots (outside the state dir) and fit the model, the
budgets fit some node, and a plan exists. Each failure raises InvalidSpec/InfeasibleBudget
with the fix.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from wstrain.scheduler.contracts.access import DataAccess
from wstrain.scheduler.contracts.calibration import GIB
from wstrain.scheduler.contracts.documents import END_OF_TEXT_TOKENS, documents
from wstrain.scheduler.contracts.errors import InvalidSpec
from wstrain.scheduler.contracts.hardware import DEFAULT_PROFILE, NodeProfile
from wstrain.scheduler.contracts.jobs import Node
from wstrain.scheduler.contracts.model_dims import ModelDims, resolve_dims
from wstrain.scheduler.contracts.model_refs import PathModel
from wstrain.scheduler.contracts.plan import Plan
from wstrain.scheduler.contracts.spec import JobSpec, SyntheticData, TextData, TokenData
from wstrain.scheduler.contracts.token_file import (
    RAW_TEXT_MAX_BYTES,
    TokenFileHeader,
    document_span,
    header_path,
    index_path,
    prepare_command,
    token_dtype,
)
from wstrain.scheduler.planning.planner import make_plan

_TOKEN_BYTES = {"uint16": 2, "uint32": 4}
# token ids checked on submit: 8 MiB of uint32 reads in ~2 ms; wrong-tokenizer files show in
# their first ids, and the worker checks the rest
HEAD_TOKENS = 1 << 21
# documents whose lengths price a document_mask job's attention on submit: 35 ms of Python
# on the dev VM, and on a million random lengths within 0.1% of the span of all of them,
# which the agent reads before the job runs (agent/launch.py)
SUBMIT_SPAN_DOCUMENTS = 1 << 16


def _check_tokens(
    data: TokenData, path: Path, vocab_size: int, seq_len: int
) -> tuple[int, TokenFileHeader | None]:
    """dtype, length and the head's token ids of a .bin (raw or prepared) or .npy token file;
    its length and its header (None for a bare file). Only the first HEAD_TOKENS ids are read
    here, so a submission costs the same for a 2 GiB file as for a small one; the worker
    checks every id before it trains (worker/io/data.py)."""
    header = None
    if path.suffix == ".npy":
        try:
            tokens = np.load(path, mmap_mode="r")
        except ValueError as exc:
            raise InvalidSpec(
                f"data.path={data.path!r} is not a readable .npy file: {exc}"
            ) from exc
        if data.dtype is not None and tokens.dtype != np.dtype(data.dtype):
            raise InvalidSpec(
                f"data.path={data.path!r} holds {tokens.dtype} tokens but "
                f"data.dtype={data.dtype!r}; set data.dtype to match (uint16 or "
                "uint32) or convert the file"
            )
        tokens = tokens.reshape(-1)
    else:
        try:
            dtype, header = token_dtype(path, data.dtype)
        except ValueError as exc:
            raise InvalidSpec(f"data.path: {exc}") from exc
        size, width = path.stat().st_size, _TOKEN_BYTES[dtype]
        if size % width or (header is not None and size != header.tokens * width):
            raise InvalidSpec(
                f"data.path={data.path!r} has {size} bytes, not a multiple of "
                f"{width}"
                + (
                    ""
                    if header is None
                    else f" x {header.tokens} tokens as its header says; prepare it again"
                )
                + f"; is the dtype {dtype!r} right?"
            )
        if header is not None and header.vocab_size > vocab_size:
            raise InvalidSpec(
                f"data.path={data.path!r} was made with a tokenizer of {header.vocab_size} "
                f"tokens ({header.tokenizer}) but the model's vocab_size is {vocab_size}; "
                "use a model with a larger vocabulary or prepare the data with its tokenizer"
            )
        tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
    if len(tokens) < seq_len + 1:
        raise InvalidSpec(
            f"data.path={data.path!r} holds {len(tokens)} tokens, fewer than "
            f"one sequence of seq_len+1={seq_len + 1}"
        )
    head = tokens[:HEAD_TOKENS]
    top = int(head.max())
    if top >= vocab_size:
        at = int(np.argmax(head >= vocab_size))
        raise InvalidSpec(
            f"data.path={data.path!r} holds token id {head[at]} (at position {at}, max "
            f"{top}) but the model's vocab_size is {vocab_size}; use a model with a larger "
            "vocabulary or the tokenizer the file was made with"
        )
    return len(tokens), header


def _check_jsonl(data: TextData) -> None:
    """Every line a JSON object whose `text_field` is a string."""
    try:
        for _ in documents(data.path, data.text_field):
            pass
    except ValueError as exc:
        raise InvalidSpec(f"data.path: {exc}; fix the line or set data.text_field") from exc


def _check_data(spec: JobSpec, dims: ModelDims, access: DataAccess) -> None:
    data = spec.data
    if spec.document_mask and isinstance(data, SyntheticData):
        raise InvalidSpec("document_mask: synthetic data has no documents; set it false")
    if isinstance(data, (TokenData, TextData)):
        path = access.check(data.path, "data.path")
        if not path.is_file():
            raise InvalidSpec(f"data.path={data.path!r} does not exist or is not a file")
    if isinstance(data, TokenData):
        header_file = header_path(path)  # a .bin's header is read below: under a root too
        if path.suffix == ".bin" and header_file.exists():
            access.check(str(header_file), "data.path's header")
        count, header = _check_tokens(data, path, dims.vocab_size, spec.seq_len)
        if spec.document_mask and (header is None or not header.documents):
            raise InvalidSpec(
                f"document_mask: data.path={data.path!r} has no document index (NAME.idx "
                "with its NAME.json header); make the file with `wstrain prepare`, or set "
                "document_mask: false"
            )
        held_out = int(count * spec.eval.heldout_fraction) if spec.eval else None
        if held_out is not None and held_out < spec.seq_len + 1:
            raise InvalidSpec(
                f"eval.heldout_fraction={spec.eval.heldout_fraction} of "  # type: ignore[union-attr]
                f"{count} tokens leaves {held_out}, fewer than one sequence of "
                f"seq_len+1={spec.seq_len + 1}; raise the fraction or use more data"
            )
    if isinstance(data, TextData):
        size = path.stat().st_size
        if size > RAW_TEXT_MAX_BYTES:
            command = prepare_command(data.path, data.tokenizer, data.text_field)
            raise InvalidSpec(
                f"data.path={data.path!r} is {size / 2**20:.0f} MiB of raw text, over the "
                f"{RAW_TEXT_MAX_BYTES >> 20} MiB a job tokenizes at its start; make a token "
                f"file once, on all cores: `{command}`, and submit data: "
                "{kind: tokens, path: ...bin}"
            )
        vocab, specials = 256, set()
        if data.path.endswith(".jsonl"):
            _check_jsonl(data)
        if data.tokenizer != "byte":
            tok = access.check(data.tokenizer, "data.tokenizer")
            if not tok.is_file():
                raise InvalidSpec(
                    f"data.tokenizer={data.tokenizer!r} does not exist; give a "
                    'tokenizer.json or "byte"'
                )
            try:
                parsed = json.loads(tok.read_text())
                vocab = len(parsed["model"]["vocab"])
                specials = {t["content"] for t in parsed.get("added_tokens", [])}
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidSpec(
                    f"data.tokenizer={data.tokenizer!r} is not a tokenizers tokenizer.json: {exc}"
                ) from exc
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


def validate_and_plan(spec: JobSpec, nodes: list[Node], access: DataAccess) -> Plan:
    if isinstance(spec.model, PathModel):
        model_dir = access.check(spec.model.path, "model.path")
        if model_dir.is_dir() and not any(model_dir.glob("*.safetensors")):
            raise InvalidSpec(
                f"model.path={spec.model.path!r} holds no *.safetensors weights "
                "to fine-tune; save the model with save_pretrained (safetensors), "
                'or name {"hf_config": ...} to train from scratch'
            )
    dims = resolve_dims(spec.model)
    _check_data(spec, dims, access)
    node = pick_node(spec, nodes)
    if spec.document_mask and isinstance(spec.data, TokenData):  # _check_data: it has an index
        access.check(str(index_path(spec.data.path)), "data.path's index")  # under a root too
        try:
            span = document_span(spec.data.path, spec.seq_len, SUBMIT_SPAN_DOCUMENTS)
        except OSError as exc:
            raise InvalidSpec(
                f"data.path={spec.data.path!r}: its document index cannot be read ({exc}); "
                "prepare the file again with `wstrain prepare`, or set document_mask: false"
            ) from exc
        node = node.with_documents(span)  # long sequences' pieces cost their documents
    return _plan(spec, dims, node)


# Plans already made, by (spec less its name, node profile): a sweep of jobs that differ in
# name only plans once. Planning is 10-75 ms of CPU a spec; under bench/api_load.py's mix it
# was a quarter of the API's CPU, for a tenth of the requests.
_PLANS: OrderedDict[tuple[str, NodeProfile], Plan] = OrderedDict()
_PLANS_MAX = 256
_PLANS_LOCK = threading.Lock()  # planning runs in a pool of threads


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
