"""api/validation.py's plan at submission for packed documents: a document_mask job on a
prepared token file is priced at its documents' attention span, read from the file's index
as the agent reads it before the job runs (agent/launch.py), so the plan a user gets back
on submit predicts what runs instead of the whole sequence's attention.

    pytest tests/api/test_validation.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wstrain.api.validation import validate_and_plan
from wstrain.contracts.access import DataAccess
from wstrain.contracts.errors import InvalidSpec
from wstrain.contracts.spec import JobSpec
from wstrain.prepare.pipeline import PrepareRequest, prepare

SEQ = 131072


def _spec(path: Path, document_mask: bool) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "docs",
            "model": {"preset": "llama3-8b-16l"},
            "data": {"kind": "tokens", "path": str(path)},
            "seq_len": SEQ,
            "global_batch": 1,
            "steps": 1,
            "document_mask": document_mask,
            "budget": {"device_gib": 24, "host_gib": 110},
        }
    )


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared token file of 2,000-token documents (1,999 bytes and end-of-text)."""
    root = tmp_path_factory.mktemp("docs")
    src = root / "d.jsonl"
    src.write_text("".join(json.dumps({"text": "y" * 1999}) + "\n" for _ in range(70)))
    out = root / "d.bin"
    prepare(PrepareRequest(str(src), str(out)))
    return out


def test_a_document_jobs_plan_on_submit_costs_its_documents(short_documents: Path) -> None:
    access = DataAccess.of([short_documents.parent], None)
    packed = validate_and_plan(_spec(short_documents, True), [], access)
    whole = validate_and_plan(_spec(short_documents, False), [], access)
    assert packed.working_set is not None and packed.working_set.seq_chunk  # in pieces
    # a query attends to its 2,000-token document, not to 128K keys: the attention, most of
    # the step at this length, shrinks ~65x and the step several times
    assert packed.predicted.step_seconds < 0.5 * whole.predicted.step_seconds


@pytest.mark.parametrize(("side", "field"), [(".idx", "index"), (".json", "header")])
def test_a_side_file_outside_the_data_roots_is_refused(
    short_documents: Path, tmp_path_factory: pytest.TempPathFactory, side: str, field: str
) -> None:
    """The header and index beside a token file under a data root are read on submit, so
    they must lie under a root too: a symlink to a file elsewhere is a 4xx, not a read."""
    root = tmp_path_factory.mktemp("root")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    for suffix in (".bin", ".json", ".idx"):
        target = (elsewhere if suffix == side else root) / f"d{suffix}"
        target.write_bytes(short_documents.with_suffix(suffix).read_bytes())
    (root / f"d{side}").symlink_to(elsewhere / f"d{side}")
    with pytest.raises(InvalidSpec, match=rf"{field}=.*lies outside the data roots"):
        validate_and_plan(_spec(root / "d.bin", True), [], DataAccess.of([root], None))
