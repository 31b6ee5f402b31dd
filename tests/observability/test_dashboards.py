"""The dashboards are what Grafana's typed SDK renders (its models come from Grafana's
dashboard schema), parse back into those models, and refer only to provisioned datasources;
the deploy files are accepted by the programs that read them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard

from tests.conftest import REPO
from wstrain.agent.settings import AgentSettings
from wstrain.api.settings import ServiceSettings
from wstrain.contracts import metrics

DEPLOY = REPO / "deploy"
BOARDS = sorted((REPO / "dashboards").glob("*.json"))


def test_dashboard_json_is_what_the_sdk_builds() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "dashboards" / "build.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert {p.name for p in BOARDS} == {"queue.json", "job.json", "overview.json"}


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_dashboard_parses_into_grafana_models(path: Path) -> None:
    raw = json.loads(path.read_text())
    board = Dashboard.from_json(raw)
    assert board.uid and board.title and board.panels
    again = json.loads(json.dumps(board.to_json(), default=lambda o: o.to_json()))
    assert again["panels"] == raw["panels"]  # nothing we wrote was dropped by the schema model


def test_every_wstrain_series_a_query_names_is_in_the_metrics_contract() -> None:
    known = {m.name for m in metrics.ALL}
    known |= {
        f"{m.name}_{part}"
        for m in metrics.ALL
        if m.kind is metrics.Kind.histogram
        for part in ("bucket", "sum", "count")
    }
    named = set()
    for path in BOARDS:
        board = json.loads(path.read_text())
        exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
        exprs += [v["query"] for v in board.get("templating", {}).get("list", [])]
        for expr in exprs:
            named |= set(re.findall(r"\bwstrain_[a-z_]+", str(expr)))
    assert named and named <= known, named - known


def test_home_dashboard_and_data_links_name_existing_boards() -> None:
    uids = {json.loads(p.read_text())["uid"]: p.name for p in BOARDS}
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    home = compose["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert home.rsplit("/", 1)[1] == uids["wstrain-queue"]
    links = re.findall(r"/d/([a-z-]+)/", "".join(p.read_text() for p in BOARDS))
    assert links and set(links) <= set(uids), links


def test_every_datasource_reference_is_provisioned() -> None:
    provisioned = set()
    for f in (DEPLOY / "grafana" / "provisioning" / "datasources").glob("*.yml"):
        provisioned |= {d["uid"] for d in yaml.safe_load(f.read_text())["datasources"]}
    refs = set()
    for path in BOARDS:
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            if "targets" not in panel:  # a text panel queries nothing
                assert panel["type"] == "text", panel["title"]
                continue
            refs |= {item["datasource"]["uid"] for item in [panel, *panel["targets"]]}
        refs |= {v["datasource"]["uid"] for v in board.get("templating", {}).get("list", [])}
    assert refs and refs <= provisioned, refs - provisioned


def test_grafana_provisioning_path_matches_the_compose_mount() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "wstrain.yml").read_text()
    )["providers"][0]
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["../dashboards"] == provider["options"]["path"]
    for service in compose["services"].values():  # every bind-mounted repo path exists
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), source


def test_promtool_accepts_the_deploy_config() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed; scripts/setup.sh installs the prometheus package")
    result = subprocess.run(
        [promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_setting_is_documented_and_every_documented_variable_exists() -> None:
    fields = set(AgentSettings.model_fields) | set(ServiceSettings.model_fields)
    names = {f"WSTRAIN_{f.upper()}" for f in fields}
    operations = (REPO / "docs" / "OPERATIONS.md").read_text()
    section = operations.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(WSTRAIN_[A-Z_]+)`", section))
    assert names - documented == set(), "undocumented settings"
    deployed = set(
        re.findall(r"^(WSTRAIN_[A-Z_]+)=", (DEPLOY / "systemd" / "wstrain.env").read_text(), re.M)
    )
    compose = (DEPLOY / "compose.yaml").read_text()
    deployed |= set(re.findall(r"(WSTRAIN_[A-Z_]+):", compose))
    assert deployed - names - {"WSTRAIN_DATA_DIR"} == set(), "deploy files set unknown variables"
