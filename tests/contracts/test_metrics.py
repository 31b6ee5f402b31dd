"""The metric catalogue: Prometheus's naming rules hold for every series, and every HELP
text says its unit, so a reader of /metrics never guesses (bytes or GiB? seconds or ms?)."""

from __future__ import annotations

import re

import pytest

from wstrain.contracts import metrics as m

# base-unit suffix -> words one of which the HELP text must contain
UNIT_WORDS = {
    "_bytes": ("bytes", "memory"),
    "_seconds": ("seconds", "unix time"),
    "_bytes_per_second": ("bytes/s", "throughput", "ceiling", "bandwidth"),
    "_flops_per_second": ("flop/s",),
    "_ratio": ("0..1", "fraction"),
    "_watts": ("watts",),
    "_celsius": ("celsius",),
}


@pytest.mark.parametrize("metric", m.ALL, ids=lambda x: x.name)
def test_name_type_and_help(metric: m.Metric) -> None:
    assert re.fullmatch(r"wstrain_[a-z0-9_]+", metric.name)
    assert metric.name.endswith("_total") == (metric.kind is m.Kind.counter)
    assert metric.help.endswith(".") and len(metric.help) > 15
    assert "le" not in metric.labels and "instance" not in metric.labels
    base = metric.name.removesuffix("_total")
    if base.endswith("_timestamp_seconds"):
        words: tuple[str, ...] = ("unix time",)
    else:
        suffix = max((s for s in UNIT_WORDS if base.endswith(s)), key=len, default="")
        words = UNIT_WORDS.get(suffix, ())
    assert not words or any(w in metric.help.lower() for w in words), (metric.name, words)


def test_names_are_unique_and_indexed() -> None:
    assert len(m.BY_NAME) == len(m.ALL) >= 40
    assert m.BY_NAME["wstrain_job_info"].labels == (
        "job", "owner", "name", "model", "runtime", "gpu", "node"
    )  # fmt: skip
