"""JSON Lines training documents, read the same way by the API (which checks every line at
submission) and by the worker (which tokenizes and packs them). Torch-free.

    for text in documents("/data/train.jsonl", "text"): ...
"""

from __future__ import annotations

import json
from collections.abc import Iterator


def documents(path: str, field: str) -> Iterator[str]:
    """The `field` string of each JSON object of a .jsonl file, blank lines skipped;
    ValueError names the first bad line."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)[field]
            except (ValueError, KeyError, TypeError):
                doc = None
            if not isinstance(doc, str):
                raise ValueError(
                    f"{path} line {number} is not a JSON object with a {field!r} string"
                )
            yield doc
