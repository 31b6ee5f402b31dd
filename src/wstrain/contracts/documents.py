"""JSON Lines training documents, read the same way by the API (which checks every line at
submission) and by the worker (which tokenizes and packs them). Torch-free.

    for text in documents("/data/train.jsonl", "text"): ...
"""

from __future__ import annotations

import json
from collections.abc import Iterator

# Special tokens taken as a tokenizer's end of text, in this order of preference.
END_OF_TEXT_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>")


def documents(path: str, field: str, name: str | None = None) -> Iterator[str]:
    """The `field` string of each JSON object of a .jsonl file, blank lines skipped;
    ValueError names the first bad line by its number in the file `name` (default `path`:
    pass the user's path when reading /proc/self/fd/N), never by its content."""
    shown = name if name is not None else path
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{shown} line {number} is not UTF-8; save it as UTF-8") from None
            if not line.strip():
                continue
            try:
                doc = json.loads(line)[field]
            except (ValueError, KeyError, TypeError, IndexError, RecursionError):
                doc = None
            if not isinstance(doc, str):
                raise ValueError(
                    f"{shown} line {number} is not a JSON object with a {field!r} string"
                )
            yield doc


def end_of_text_id(tok: object) -> int:
    """The id of a tokenizers Tokenizer's end-of-text token (END_OF_TEXT_TOKENS, first
    found); ValueError if it has none."""
    for name in END_OF_TEXT_TOKENS:
        found = tok.token_to_id(name)  # type: ignore[attr-defined]
        if found is not None:
            return int(found)
    raise ValueError(
        f"the tokenizer has none of the end-of-text tokens {END_OF_TEXT_TOKENS} that "
        "separate packed documents; add one to it"
    )
