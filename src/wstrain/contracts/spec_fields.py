"""What every user-written contract shares: the bounds on numbers, paths and strings a
client may send, the text check every spec string passes, and the strict base model that
refuses unknown fields. Pydantic and the standard library only, as all of contracts/."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

# Bounds on what a real job can use, so no number a client sends can make planning or
# validation walk for hours: 65,536 sequences a step is 32x the largest published
# pretraining batches at 8K tokens; 10^8 steps outlasts any run; 64 TiB outsizes any node.
MAX_GLOBAL_BATCH = 1 << 16
MAX_STEPS = 100_000_000
MAX_TIME_LIMIT_S = 366 * 86400  # a year: longer is no limit, and floats past it are nonsense
MAX_BUDGET_GIB = 65536.0
MAX_GPUS = 8  # GPUs of one node a data-parallel job takes: the largest common host (8 SXM)
MAX_NODES = 16  # nodes one job spans: every member holds its share until the gang is whole
MAX_PATH_CHARS = 4096  # Linux PATH_MAX
# Strings anywhere in a spec longer than this are refused (a name is 128, a path 4096; a
# free-form string in an hf_config, such as a rope type, is short).
MAX_STRING_CHARS = 4096

# Validation context of a spec read back from the store: it passed every check on submission.
STORED = "stored"

Path_ = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS)]


def check_text(value: object, where: str = "spec") -> None:
    """Refuse a NUL byte or a lone surrogate in any string of a JSON value (keys included):
    neither can be a path, a name or a tokenizer, and a surrogate cannot even be stored as
    UTF-8. Raises ValueError naming the field."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where}: contains a NUL byte; remove it")
        if len(value) > MAX_STRING_CHARS:
            raise ValueError(f"{where}: {len(value)} characters, over {MAX_STRING_CHARS}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where}: contains a lone surrogate, not valid UTF-8") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(k, f"{where} key")
            check_text(v, f"{where}.{str(k)[:64]!s}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_text(v, f"{where}[{i}]")


class StrictModel(BaseModel):
    """Unknown fields are refused everywhere a user writes JSON."""

    model_config = ConfigDict(extra="forbid")
