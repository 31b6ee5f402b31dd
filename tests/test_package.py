"""The package's shape: installed only as `wstrain.*`, no import cycle between any two of its
modules, one Runtime interface in the worker process, each calibration number defined once.

    pytest tests/test_package.py
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from wstrain.contracts import calibration

SRC = Path(__file__).resolve().parents[1] / "src" / "wstrain"
BENCH = SRC.parents[1] / "bench"


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_installed_under_wstrain_only(tmp_path: Path) -> None:
    """From outside the checkout the three processes import as wstrain.*; the bare names that
    PyPI's `service`, `scheduler` and `worker` packages own are not ours."""
    ok = _python("import wstrain.api.app, wstrain, wstrain.worker", tmp_path)
    assert ok.returncode == 0, ok.stderr
    for bare in ("service", "scheduler", "worker"):
        res = _python(f"import {bare}", tmp_path)
        assert res.returncode != 0 and "ModuleNotFoundError" in res.stderr, (bare, res.stderr)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules() -> None:
    """Function-local imports included: grimp reads every import statement."""
    graph = grimp.build_graph("wstrain")
    assert len(graph.modules) > 50
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_worker_process_never_asks_which_runtime() -> None:
    tree = ast.parse((SRC / "worker" / "main.py").read_text())
    runtimes = {"ResidentRuntime", "WorkingSetRuntime"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            assert not names & runtimes, ast.unparse(node)


def _module_constants(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}
    return names


def test_each_calibration_number_is_defined_once() -> None:
    shared = _module_constants(SRC / "contracts" / "calibration.py")
    assert {"GIB", "DEVICE_RESERVE_BYTES", "PROCESS_BYTES", "LEVELS"} <= shared
    assert all(hasattr(calibration, name) for name in shared)
    for path in [*SRC.rglob("*.py"), *BENCH.glob("*.py")]:
        if path.name == "calibration.py":
            continue
        again = _module_constants(path) & shared
        assert not again, f"{path} defines {sorted(again)} again; import them from calibration"


ROOMS = ("agent", "api", "cli", "contracts", "planning", "policy", "prepare", "store", "worker")


def test_the_tree_is_the_rooms() -> None:
    """src/wstrain/ holds the rooms (three processes, a client, shared layers) and the shared
    settings module, nothing else; README names each room."""
    found = {p.name for p in SRC.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert found == set(ROOMS)
    assert {p.name for p in SRC.glob("*.py")} == {"__init__.py", "settings.py"}
    readme = (SRC.parents[1] / "README.md").read_text()
    missing = [room for room in ROOMS if f"`{room}/`" not in readme]
    assert not missing, f"README has no entry for {missing}"


@pytest.mark.parametrize("folder", ROOMS)
def test_every_module_opens_with_a_docstring(folder: str) -> None:
    for path in (SRC / folder).rglob("*.py"):
        assert ast.get_docstring(ast.parse(path.read_text())), f"{path} has no docstring"


MODULE_MAX_LINES = 400  # one job a module: past 400 lines it holds two


def test_no_module_over_400_lines() -> None:
    too_long = {
        str(path.relative_to(SRC.parents[1])): n
        for path in [*SRC.rglob("*.py"), *BENCH.glob("*.py")]
        if (n := len(path.read_text().splitlines())) > MODULE_MAX_LINES
    }
    assert not too_long, f"modules over {MODULE_MAX_LINES} lines: {too_long}"


def test_worker_and_bench_import_without_the_service_stack(tmp_path: Path) -> None:
    """The lent GPU machine has torch and pydantic but no FastAPI, Redis or uvicorn: the
    worker and every benchmark must import there from a bare checkout (PYTHONPATH=src)."""
    blocked = ("fastapi", "redis", "uvicorn", "pydantic_settings", "httpx", "starlette")
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("not on the GPU machine: " + name)
sys.meta_path.insert(0, Block())
import wstrain.worker.main, wstrain.worker.profile.node, wstrain.worker.profile.layer
import bench.runtime, bench.baselines, bench.bound, bench.sweep, bench.moe, bench.memprobe
import bench.host_adamw, bench.load_rss, bench.planner, bench.timeline, bench.pack
import bench.queue_sim
"""
    env = {**os.environ, "PYTHONPATH": f"{SRC.parent}{os.pathsep}{BENCH.parent}"}
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
