"""README is a front page and docs/ holds the rest: its length, what its first screen says,
links that resolve inside the repository, and the numbers table's links to the results.
Pure file reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]

README_MAX_LINES = 300  # a front page, read to the end; the design and guides live in docs/
FIRST_SCREEN_LINES = 60  # what a newcomer sees before scrolling: what, the commands, a job
RESULTS = REPO / "bench" / "RESULTS.md"

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# Paths of a particular machine: a home, a scratch dir, a work tree; and the sibling folder
# the project's notes were once kept in, outside the repository.
MACHINE_PATH = re.compile(r"(?<![\w.$~-])/(?:work|tmp|home|root|Users|mnt)/")
OUTSIDE = re.compile(r"\.\./shared\b")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # no headings in code
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def _links(page: Path) -> list[str]:
    targets = LINK.findall(page.read_text())
    return [t for t in targets if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto:


def test_the_pages_exist() -> None:
    names = {p.name for p in DOCS}
    assert {"DESIGN.md", "API.md", "OPERATIONS.md"} <= names, names


def test_readme_is_under_300_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_first_screen_holds_the_commands_and_the_first_job() -> None:
    first = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN_LINES])
    for command in (
        "bash scripts/serve.sh",
        "bash scripts/test.sh",
        "wstrain submit examples/tiny-llama.yaml --follow",
    ):
        assert command in first, f"{command!r} is not in README's first {FIRST_SCREEN_LINES}"
    assert "docs/" in first, "the first screen says where to go next"


def test_the_first_job_and_the_commands_exist() -> None:
    for path in ("scripts/serve.sh", "scripts/test.sh", "examples/tiny-llama.yaml"):
        assert (REPO / path).is_file(), path


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_path_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    assert not OUTSIDE.search(text), f"{page.name} points outside the repository"
    machine = sorted({m.group(0) for m in MACHINE_PATH.finditer(text)})
    assert not machine, f"{page.name} names paths of one machine: {machine}"
    if page == README:
        assert "../" not in text, "README.md names a path above the repository"
    for target in _links(page):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(REPO), f"{page.name}: {target} leaves the repository"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    for target in _links(page):
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        assert path.exists(), f"{page.name}: {target} names no file"
        if not anchor:
            continue
        if path in PAGES or path == RESULTS:  # the results' topics are their headings
            assert anchor in _anchors(path), f"{page.name}: {target} names no heading"


def test_the_numbers_table_links_every_row_to_the_results() -> None:
    text = README.read_text()
    assert "## Numbers" in text
    section = text.split("## Numbers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and "---" not in line][
        1:
    ]  # the header row names the columns
    assert len(rows) >= 5, "one table of the headline numbers"
    unlinked = [row for row in rows if "](bench/RESULTS.md#" not in row]
    assert not unlinked, f"rows without a link to bench/RESULTS.md: {unlinked}"
