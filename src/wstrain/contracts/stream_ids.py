"""A Redis stream id as a client sends it back (`after=`, `Last-Event-ID`), checked in full
before it reaches Redis, which answers an out-of-range id with an error (a 500 before).

An id is "<ms>" or "<ms>-<seq>", each part a decimal without leading zeros (as Redis writes
them) of at most 2^64-1: Redis stores both parts as unsigned 64-bit integers.
STREAM_ID_PATTERN says exactly that, for the OpenAPI document; check_stream_id enforces it
with a message that names the part out of range and the fix.

Nothing can follow LAST_ID, and Redis refuses to read "after" it (XRANGE "(<LAST_ID>"
is an error): a route reading after it answers an empty page instead of asking Redis.

    after: Annotated[StreamId | None, Query(json_schema_extra=STREAM_ID_SCHEMA)] = None
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

U64_MAX = 2**64 - 1  # 18446744073709551615: Redis' stream id parts are unsigned 64-bit
LAST_ID = f"{U64_MAX}-{U64_MAX}"


def _at_most(limit: str) -> str:
    """A regex for the decimals 0..int(limit) without leading zeros."""
    n = len(limit)
    shorter = [f"[1-9][0-9]{{0,{n - 2}}}"] if n > 1 else []
    same_length = []
    for i, digit in enumerate(limit):  # limit[:i], then a smaller digit, then anything
        lowest = 1 if i == 0 else 0
        if int(digit) > lowest:
            rest = f"[0-9]{{{n - i - 1}}}" if n - i - 1 else ""
            same_length.append(f"{limit[:i]}[{lowest}-{int(digit) - 1}]{rest}")
    return "|".join(["0", *shorter, *same_length, limit])


_PART = f"(?:{_at_most(str(U64_MAX))})"
STREAM_ID_PATTERN = f"^{_PART}(?:-{_PART})?$"
STREAM_ID_SCHEMA: dict[str, object] = {
    "pattern": STREAM_ID_PATTERN,
    "description": "a stream id as events and log lines carry it: <ms>-<seq> or <ms>, "
    "each part at most 2^64-1",
}
_SHAPE = re.compile(STREAM_ID_PATTERN)
_DIGITS = re.compile(r"^[0-9]+(?:-[0-9]+)?$")


def check_stream_id(value: str) -> str:
    """`value` if it is a stream id Redis takes, else a ValueError naming the fix."""
    if _SHAPE.match(value):
        return value
    fix = "pass an `id` from an event or a log line"
    if not _DIGITS.match(value):
        raise ValueError(f"{value[:40]!r} is not a stream id (<ms>-<seq> or <ms>); {fix}")
    for part in value.split("-"):
        if len(part) > 1 and part.startswith("0"):
            raise ValueError(f"stream id part {part[:40]} has a leading zero; {fix}")
        if len(part) > len(str(U64_MAX)) or int(part) > U64_MAX:
            raise ValueError(f"stream id part {part[:40]} is past 2^64-1 ({U64_MAX}); {fix}")
    raise AssertionError(f"{value!r}: digits in range without leading zeros match the pattern")


StreamId = Annotated[str, AfterValidator(check_stream_id)]
