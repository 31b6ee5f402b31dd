"""agent/launch.py: what the agent reads before planning a job. A document_mask job on a
prepared token file plans with its documents' attention span from the file's index; other
jobs, and text data, plan with none (the whole sequence's attention).

    pytest tests/agent/test_launch.py
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from wstrain.agent.launch import _document_span
from wstrain.contracts.access import DataAccess
from wstrain.contracts.spec import JobSpec
from wstrain.prepare.pipeline import PrepareRequest, prepare


def _spec(data: dict[str, object], document_mask: bool) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "d",
            "model": {"preset": "tiny-llama"},
            "data": data,
            "seq_len": 64,
            "global_batch": 1,
            "steps": 1,
            "document_mask": document_mask,
            "budget": {"device_gib": 1, "host_gib": 1},
        }
    )


def test_a_document_jobs_plan_reads_the_span_of_its_token_file(tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": "y" * 15}) + "\n" for _ in range(40)))
    out = tmp_path / "d.bin"
    prepare(PrepareRequest(str(src), str(out)))  # 16-token documents: 15 bytes and eos
    tokens = {"kind": "tokens", "path": str(out)}
    access = DataAccess.of([tmp_path], None)
    assert asyncio.run(_document_span("j", _spec(tokens, True), access)) == 16
    assert asyncio.run(_document_span("j", _spec(tokens, False), access)) == 0
    text = {"kind": "text", "path": str(src), "tokenizer": "byte"}
    assert asyncio.run(_document_span("j", _spec(text, True), access)) == 0
