"""JSON Lines training documents, read the same way by the API (which checks every line at
submission) and by the worker (which tokenizes and packs them). Torch-free.

    for text in documents("/data/train.jsonl", "text"): ...
"""

from __future__ import annotations

import json
from collections.abc import Iterator

# Special tokens taken as a tokenizer's end of text, in this order of preference.
END_OF_TEXT_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>")


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
