"""Job spec files for `wstrain submit` and `wstrain plan`: read (YAML or JSON), relative
paths made absolute against the spec file's directory, and sweeps expanded into one spec per
point.

    spec = load_spec("runs/lr.yaml")      # data.path: ../data/web.bin -> /home/me/data/web.bin
    spec = with_gpus(spec, 2)             # submit --gpus 2
    spec = with_budget(spec, {"min": 12.0, "max": 40.0}, None)   # --device-gib 12:40
    points = sweep_specs(spec, parse_sweeps(["optimizer.lr=1e-4,3e-4", "seed=0,1"]))
    ids = submit_sweep(client, points)    # 4 jobs named NAME-0..3, one shared `group`

Paths are resolved here, on the client, because the spec's directory is known only here;
the server still checks every path against its data roots. Numbers are read as YAML 1.2
reads them (`1e-4` is a float; YAML 1.1, PyYAML's default, makes it a string). A spec file
that cannot be used exits 2 with the reason, as does a malformed --sweep.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import logging
import math
import os
import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from wstrain.cli.client import CliError, call

log = logging.getLogger(__name__)

MAX_SWEEP_POINTS = 256  # more jobs than a lab queue should take from one command
NAME_MAX_CHARS = 128  # JobSpec.name's limit
# (section, field) of every path a spec may hold; `tokenizer` also takes the name "byte"
PATH_FIELDS = (("model", "path"), ("data", "path"), ("data", "tokenizer"))
NOT_PATHS = frozenset({"byte"})


class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's floats: `1e-4`, `3E5` and `.5` are numbers, not strings."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
        r"|[0-9][0-9_]*\.[0-9_]*|\.(?:inf|Inf|INF)|[-+]\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def usage_error(message: str) -> SystemExit:
    print(f"wstrain: {message}", file=sys.stderr)
    return SystemExit(2)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Yaml12Loader)  # a SafeLoader: builds plain data only


def resolve_paths(spec: dict[str, Any], base: Path) -> dict[str, Any]:
    """A copy of `spec` whose relative (and ~) paths are absolute, relative to `base`."""
    out = copy.deepcopy(spec)
    for section, field in PATH_FIELDS:
        part = out.get(section)
        if not isinstance(part, dict) or not isinstance(part.get(field), str):
            continue
        value: str = part[field]
        if value in NOT_PATHS or not value:
            continue
        path = os.path.expanduser(value)
        # normpath, not resolve(): symlinks are the server's to follow, as it sees them
        part[field] = os.path.normpath(os.path.join(base, path))
    return out


def load_spec(path: str) -> dict[str, Any]:
    """The spec in `path` with its paths made absolute; exits 2 if it cannot be used."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise usage_error(f"cannot read spec {path}: {exc}") from exc
    try:
        spec = _yaml(text)
    except yaml.YAMLError as exc:
        raise usage_error(f"{path} is not valid YAML/JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise usage_error(f"{path} must hold a mapping (a JobSpec), not {type(spec).__name__}")
    return resolve_paths(spec, Path(path).resolve().parent)


def with_gpus(spec: dict[str, Any], gpus: int | None) -> dict[str, Any]:
    """`submit --gpus N`: the spec trains data parallel on N GPUs of one node (the server
    checks N: 1..8, dividing global_batch); None leaves the spec's own `gpus`."""
    return spec if gpus is None else {**spec, "gpus": gpus}


def with_nodes(spec: dict[str, Any], nodes: int | None) -> dict[str, Any]:
    """`submit --nodes M`: the spec spans M nodes, `gpus` on each (the server checks M:
    1..16, gpus x nodes dividing global_batch); None leaves the spec's own `nodes`."""
    return spec if nodes is None else {**spec, "nodes": nodes}


GibArg = float | dict[str, float]  # a budget flag's value: GiB, or a range {min, max}


def gib_or_range(flag: str) -> Callable[[str], GibArg]:
    """The argparse type of `flag` (--device-gib, --host-gib): a number of GiB ("40") or a
    range MIN:MAX ("12:40"); a bad value is an error naming the flag (argparse exits 2)."""

    def parse(text: str) -> GibArg:
        parts = text.split(":")
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            numbers = []
        if len(parts) > 2 or not numbers or not all(0 < n < math.inf for n in numbers):
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r} is not a number of GiB above 0 or a range MIN:MAX; e.g. "
                f"{flag} 40 or {flag} 12:40"
            )
        if len(numbers) == 1:
            return numbers[0]
        low, high = numbers
        if low > high:
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r}: min {low:g} is above max {high:g}; write MIN:MAX, e.g. "
                f"{flag} {high:g}:{low:g}"
            )
        return {"min": low, "max": high}

    return parse


def with_budget(
    spec: dict[str, Any], device: GibArg | None, host: GibArg | None, disk: float | None = None
) -> dict[str, Any]:
    """`--device-gib`/`--host-gib`/`--disk-gib`: the spec's budget.device_gib/host_gib (a
    number or a range {min, max}) and budget.disk_gib; None leaves the spec's own."""
    if device is None and host is None and disk is None:
        return spec
    current = spec.get("budget")
    # the service chooses the point of the new budget: a chosen one sent along is dropped
    budget = (
        {k: v for k, v in current.items() if k != "chosen"} if isinstance(current, dict) else {}
    )
    if device is not None:
        budget["device_gib"] = device
    if host is not None:
        budget["host_gib"] = host
    if disk is not None:
        budget["disk_gib"] = disk
    return {**spec, "budget": budget}


def _split_values(text: str) -> list[str]:
    """Comma-separated values; commas inside [..], {..} or quotes stay (`betas=[0.9,0.95]`)."""
    values, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i])
            start = i + 1
    values.append(text[start:])
    return [v.strip() for v in values]


Axis = tuple[list[str], list[Any]]  # a dotted key split, and its values


def parse_sweeps(items: list[str]) -> list[Axis]:
    """Each --sweep KEY=V1,V2,... as (key parts, values); exits 2 on a malformed one."""
    axes: list[Axis] = []
    seen: set[str] = set()
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
            raise usage_error(
                f"--sweep {item!r} is not KEY=V1,V2,...; e.g. --sweep optimizer.lr=1e-4,3e-4"
            )
        if key in ("name", "group") or key in seen:
            why = "given twice" if key in seen else "set by the sweep itself"
            raise usage_error(f"--sweep {key}: {why}; sweep each other key once")
        seen.add(key)
        texts = _split_values(raw)
        if any(t == "" for t in texts):
            raise usage_error(f"--sweep {item!r} has an empty value; write KEY=V1,V2 with no gaps")
        try:
            values = [_yaml(t) for t in texts]
        except yaml.YAMLError as exc:
            raise usage_error(f"--sweep {key}: a value is not a YAML scalar: {exc}") from exc
        axes.append((key.split("."), values))
    return axes


def _set(spec: dict[str, Any], parts: list[str], value: Any) -> None:
    node = spec
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise usage_error(
                f"--sweep {'.'.join(parts)}: {where} is {child!r} in the spec, not a mapping"
            )
        node = child
    node[parts[-1]] = value


def sweep_specs(
    spec: dict[str, Any], axes: list[Axis], group: str | None = None
) -> list[dict[str, Any]]:
    """One spec per point of the axes' cartesian product, the first axis slowest, each named
    NAME-i and all in one group (the spec's own `group`, else a new id)."""
    points = 1
    for _, values in axes:
        points *= len(values)
    if points > MAX_SWEEP_POINTS:
        sizes = " x ".join(str(len(v)) for _, v in axes)
        raise usage_error(
            f"the sweep has {points} points ({sizes}); at most {MAX_SWEEP_POINTS} are "
            "submitted at once: sweep fewer values or split it"
        )
    name = str(spec.get("name") or "sweep")
    group = group or spec.get("group") or f"sweep-{uuid.uuid4().hex[:12]}"
    out: list[dict[str, Any]] = []
    for i, combo in enumerate(itertools.product(*(values for _, values in axes))):
        point = copy.deepcopy(spec)
        for (parts, _), value in zip(axes, combo):
            _set(point, parts, value)
        suffix = f"-{i}"
        point["name"] = name[: NAME_MAX_CHARS - len(suffix)] + suffix
        point["group"] = group
        out.append(point)
    return out


def submit_sweep(c: httpx.Client, specs: list[dict[str, Any]]) -> list[str]:
    """Submit every point; if one is refused, cancel those already queued (nothing of a
    half-submitted sweep runs) and raise the refusal, naming the point."""
    ids: list[str] = []
    for i, spec in enumerate(specs):
        try:
            ids.append(call(c, "POST", "/v1/jobs", json=spec)["id"])
        except CliError as exc:
            for job_id in ids:
                try:
                    call(c, "POST", f"/v1/jobs/{job_id}/cancel")
                except CliError as undo:
                    log.warning("job %s of the sweep not cancelled: %s", job_id, undo)
            raise CliError(
                f"sweep point {i} ({spec['name']}) refused: {exc}; the {len(ids)} jobs "
                "submitted before it were cancelled"
            ) from exc
    return ids
