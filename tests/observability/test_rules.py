"""The alerting files of deploy/ are accepted by the programs that read them: promtool checks
the rules and runs their unit tests (rules_test.yml), and checks the Prometheus config that
loads them; amtool checks the Alertmanager config. Every alert has a case that fires and one
that does not, and every series the rules name is in the metric catalogue
(wstrain.contracts.metrics), so a rename there fails here, not in production."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from wstrain.contracts.metrics import BY_NAME, Kind

PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS / "rules.yml"
RULES_TEST = PROMETHEUS / "rules_test.yml"
ALERTMANAGER = REPO / "deploy" / "alertmanager" / "alertmanager.yml"

# Series Prometheus makes itself, per target; the rules may select them by name.
BUILTINS = {"up"}
# Labels every scraped series gets from its target (agents' job series keep their own `job`).
TARGET_LABELS = {"job", "instance"}


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; `bash scripts/setup.sh test` installs {package}")
    return path


def check(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_accepts_the_rules() -> None:
    check(tool("promtool", "prometheus"), "check", "rules", str(RULES))


def test_the_rules_pass_their_unit_tests() -> None:
    check(tool("promtool", "prometheus"), "test", "rules", str(RULES_TEST))


def test_promtool_accepts_the_prometheus_config() -> None:
    check(tool("promtool", "prometheus"), "check", "config", str(PROMETHEUS / "prometheus.yml"))
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert [(PROMETHEUS / f).resolve() for f in config["rule_files"]] == [RULES.resolve()]


def test_amtool_accepts_the_alertmanager_config() -> None:
    check(tool("amtool", "prometheus-alertmanager"), "check-config", str(ALERTMANAGER))


def test_every_alert_is_labelled_annotated_and_tested_both_ways() -> None:
    rules = alerts()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) >= 10, names
    cases: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for test in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for case in test["alert_rule_test"]:
            assert case["alertname"] in cases, f"rules_test.yml tests unknown {case['alertname']}"
            cases[case["alertname"]].append(case)
    for rule in rules:
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert {"summary", "description"} <= set(rule["annotations"]), name
        firing = [c for c in cases[name] if c.get("exp_alerts")]
        assert firing, f"{name}: no case in rules_test.yml where it fires"
        assert any(not c.get("exp_alerts") for c in cases[name]), f"{name}: no quiet case"
        for case in firing:
            for alert in case["exp_alerts"]:
                assert set(alert["exp_annotations"]) == {"summary", "description"}, name


def catalogued(name: str) -> bool:
    """A catalogue name, or a histogram's _bucket/_sum/_count series."""
    if name in BY_NAME:
        return True
    base, _, suffix = name.rpartition("_")
    metric = BY_NAME.get(base)
    histogram = metric is not None and metric.kind is Kind.histogram
    return histogram and suffix in {"bucket", "sum", "count"}


def test_every_series_in_the_rules_is_in_the_catalogue() -> None:
    # the expressions, and the PromQL the annotation templates run (`query "..."`, `printf "..."`)
    templates = " ".join(v for r in alerts() for v in r["annotations"].values())
    texts = [r["expr"] for r in alerts()] + re.findall(r'(?:query|printf) "([^"]*)"', templates)
    used = {t for text in texts for t in re.findall(r"\bwstrain_[a-z_]+", text)}
    assert len(used) >= 10, used
    assert {n for n in used if not catalogued(n)} == set(), "not in contracts/metrics.py"
    # every selector with matchers: a catalogued or built-in series, and labels it has
    for text in texts:
        for name, matchers in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}", text):
            if name in BUILTINS:
                continue
            assert catalogued(name), f"{name}: neither in the catalogue nor a built-in"
            labels = set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
            unknown = labels - set(BY_NAME[name].labels) - TARGET_LABELS
            assert unknown == set(), f"{name} has no label {unknown}"
