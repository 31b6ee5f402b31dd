"""bench/RESULTS.md and bench/README.md against the tree: the results open with one table of
current numbers, every topic has its section, every path and link they name exists, every
raw file is named for what it measures and a current one is linked from its section, and the
results carry no issue numbers (their history lives in bench/HISTORY.md and git).

    pytest tests/bench/test_results_doc.py
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
BENCH = REPO / "bench"
RESULTS_DIR = BENCH / "results"
DOCS = {name: (BENCH / name).read_text() for name in ("RESULTS.md", "README.md")}
RESULTS = DOCS["RESULTS.md"]

# The README links to these anchors; their headings must stay as written.
TOPICS = (
    "Runtime",
    "Long context",
    "Several GPUs",
    "Queue",
    "Planner",
    "Data preparation",
    "Precision (fp8)",
    "MoE",
    "Service load",
    "Host memory",
)
TOPIC_DIRS = {
    "runtime",
    "long-context",
    "several-gpus",
    "queue",
    "planner",
    "data-preparation",
    "precision",
    "moe",
    "service",
    "host-memory",
    "model-size",
}
# Where a reader should meet the headline table: after the title and one paragraph.
HEAD_LINES = 30

MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
# Repo-relative paths in backticks or prose: bench/results/..., src/..., tests/..., and so on.
REPO_PATH = re.compile(r"(?<![\w./-])((?:bench|src|tests|scripts|examples)/[\w./-]*[\w/])")
# Paths relative to bench/ that RESULTS.md names in backticks: `results/...`.
BENCH_PATH = re.compile(r"`(results/[\w./-]*)`")
PLACEHOLDER = re.compile(r"<|\bX\.json$")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_results_open_with_one_table_of_current_numbers_linking_every_topic() -> None:
    head = RESULTS.splitlines()[:HEAD_LINES]
    assert head[0].startswith("# "), "RESULTS.md starts with its title"
    rows = [line for line in head if line.startswith("|")]
    assert len(rows) >= 3, f"no table in the first {HEAD_LINES} lines of RESULTS.md"
    table = "\n".join(rows)
    for topic in TOPICS:
        assert f"](#{slug(topic)})" in table, f"the headline table has no row for {topic!r}"
    assert "results/" in table, "the headline table links no raw file"


@pytest.mark.parametrize("topic", TOPICS)
def test_each_topic_has_its_section_with_a_command_and_raw_rows(topic: str) -> None:
    sections = re.split(r"^## ", RESULTS, flags=re.M)
    body = next((s for s in sections if s.split("\n", 1)[0] == topic), None)
    assert body is not None, f"RESULTS.md has no '## {topic}' section"
    assert "python -m bench." in body, f"'## {topic}' names no command"
    assert re.search(r"\]\(results/[\w./-]+\.json\)", body), f"'## {topic}' links no raw file"


@pytest.mark.parametrize("name", sorted(DOCS))
def test_every_path_and_link_named_exists(name: str) -> None:
    text = DOCS[name]
    missing: list[str] = []
    for target in MD_LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        path, _, anchor = target.partition("#")
        exists = (BENCH / path).exists()
        if not exists or (anchor and anchor not in anchors((BENCH / path).read_text())):
            missing.append(target)
    for path in REPO_PATH.findall(text):
        path = path.split("::")[0]
        if not PLACEHOLDER.search(path) and not (REPO / path).exists():
            missing.append(path)
    for path in BENCH_PATH.findall(text):
        if not (BENCH / path).exists():
            missing.append(path)
    assert not missing, f"{name} names paths that do not exist: {missing}"


def test_the_results_carry_no_issue_numbers() -> None:
    found = re.findall(r"\bissues?\s+#?\d+", RESULTS, flags=re.I)
    assert not found, f"RESULTS.md cites issue numbers: {found}"


def test_raw_files_are_named_for_what_they_measure() -> None:
    files = sorted(RESULTS_DIR.rglob("*.json"))
    assert files
    misnamed = [
        str(f.relative_to(RESULTS_DIR))
        for f in files
        if f.parent.name not in TOPIC_DIRS | {"archive"}
        or f.parent.parent != RESULTS_DIR
        or not re.fullmatch(r"[a-z0-9][a-z0-9-]*-\d{4}-\d{2}-\d{2}\.json", f.name)
    ]
    assert not misnamed, f"not <topic>/<what>-<chip>-<date>.json: {misnamed}"


def test_every_current_raw_file_is_linked_from_the_results() -> None:
    current = [f for f in RESULTS_DIR.rglob("*.json") if f.parent.name != "archive"]
    unlinked = [
        str(f.relative_to(BENCH)) for f in current if str(f.relative_to(BENCH)) not in RESULTS
    ]
    assert not unlinked, f"current raw files RESULTS.md does not name: {unlinked}"
