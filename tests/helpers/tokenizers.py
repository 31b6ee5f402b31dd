"""A word-level tokenizers tokenizer on disk, small enough to check ids by hand."""

from __future__ import annotations

from pathlib import Path


def word_tokenizer_json(path: Path) -> Path:
    """A word-level tokenizers tokenizer with an end-of-text special token, saved as
    path/tokenizer.json: ids [UNK]=0, <|endoftext|>=1, a=2, b=3, c=4, d=5."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", "a", "b", "c", "d"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path / "tokenizer.json"))
    return path / "tokenizer.json"
