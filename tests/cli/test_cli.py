"""The `wstrain` CLI against a real uvicorn and a real Redis (and, where a job must run, a real
agent and worker): --server/--token before or after the subcommand and which one wins, the
config file, spec paths relative to the spec file, sweeps, logs, queue, the tables, and
Ctrl-C in `submit --follow` detaching while the job keeps running.

    pytest tests/cli/test_cli.py          # -m "not slow" skips the real-job tests
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import (
    CORPUS,
    REPO,
    Stack,
    secured_stack,
    tiny_spec,
    wait_job,
    wait_terminal,
)
from tests.helpers.cli import as_a_foreground_job, cli_process, run_main
from wstrain.cli.client import CliError, resolve
from wstrain.cli.main import build_parser
from wstrain.cli.spec import load_spec
from wstrain.store import JobStore
from wstrain.store.logs import JobLogs

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens there


cli = cli_process


pytestmark = pytest.mark.usefixtures("leave_the_queue_as_found")


def _total(stack: Stack) -> int:
    with stack.client() as c:
        return int(c.get("/v1/jobs", params={"limit": 1}).json()["total"])


# ---------------------------------------------------------------- server, token, config


def test_server_and_token_are_taken_before_or_after_the_subcommand() -> None:
    p = build_parser()
    assert p.parse_args(["--server", "http://a", "ls"]).server == "http://a"
    assert p.parse_args(["ls", "--server", "http://b"]).server == "http://b"
    both = p.parse_args(["--server", "http://a", "--token", "t1", "ls", "--server", "http://b"])
    assert (both.server, both.token) == ("http://b", "t1")  # the later one wins
    assert p.parse_args(["logs", "-f", "x", "--token", "t2"]).token == "t2"
    assert not hasattr(p.parse_args(["ls"]), "server")  # unset: env, file, default decide


def test_server_flags_reach_the_server_and_httpx_stays_quiet(api_only: Stack) -> None:
    after = cli("ls", "--server", api_only.url)
    assert after.returncode == 0, after.stderr
    assert "HTTP Request" not in after.stderr and after.stderr == ""
    later_wins = cli("--server", CLOSED, "ls", "--server", api_only.url)
    assert later_wins.returncode == 0, later_wins.stderr
    wrong = cli("--server", api_only.url, "queue", "--server", CLOSED)
    assert wrong.returncode == 1 and f"cannot reach the wstrain server at {CLOSED}" in wrong.stderr


def test_config_file_environment_and_flag_precedence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('server = "http://from-file:1"\ntoken = "file-token"\n')
    config.chmod(0o600)
    env = {"WSTRAIN_CONFIG": str(config)}
    assert resolve(None, None, env).server == "http://from-file:1"
    assert resolve(None, None, env).token == "file-token"
    env_too = {**env, "WSTRAIN_URL": "http://from-env:2", "WSTRAIN_TOKEN": "env-token"}
    assert (resolve(None, None, env_too).server, resolve(None, None, env_too).token) == (
        "http://from-env:2",
        "env-token",
    )
    flags = resolve("http://from-flag:3", "flag-token", env_too)
    assert (flags.server, flags.token, flags.server_from) == (
        "http://from-flag:3",
        "flag-token",
        "--server",
    )
    # the default file under XDG_CONFIG_HOME; none there: the default server, no token
    (tmp_path / "xdg" / "wstrain").mkdir(parents=True)
    (tmp_path / "xdg" / "wstrain" / "config.toml").write_text('server = "http://xdg:4"\n')
    assert resolve(None, None, {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}).server == "http://xdg:4"
    bare = resolve(None, None, {"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert (bare.server, bare.token) == ("http://127.0.0.1:8000", None)
    # mistakes name the file and the fix
    with pytest.raises(CliError, match="does not exist"):
        resolve(None, None, {"WSTRAIN_CONFIG": str(tmp_path / "nope.toml")})
    config.write_text('sever = "http://typo:1"\n')
    with pytest.raises(CliError, match=r"config.toml: sever: Extra inputs"):
        resolve(None, None, env)
    config.write_text('server = "ftp://x"\n')
    with pytest.raises(CliError, match="server"):
        resolve(None, None, env)
    config.write_text('token = "t"\n')
    config.chmod(0o644)
    resolve(None, None, env)
    assert "readable by others; chmod 600" in capsys.readouterr().err


TOKENS = {"tok-alice": "alice"}
ALICE = {"Authorization": "Bearer tok-alice"}


@pytest.fixture(scope="module")
def secured(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = secured_stack(redis_url, tmp_path_factory, "clisec", TOKENS)
    yield s
    s.stop()


def test_the_config_files_token_is_sent_and_the_environment_overrides_it(
    secured: Stack, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'server = "{secured.url}"\ntoken = "tok-alice"\n')
    config.chmod(0o600)
    env = {"WSTRAIN_CONFIG": str(config), "WSTRAIN_URL": "", "WSTRAIN_TOKEN": ""}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec("from-config")))
    sub = cli("submit", str(spec), env=env)
    assert sub.returncode == 0, sub.stderr
    listed = cli("ls", "--json", env=env)
    assert sub.stdout.strip() in {j["id"] for j in json.loads(listed.stdout)["jobs"]}
    bad = cli("ls", env={**env, "WSTRAIN_TOKEN": "tok-wrong"})
    assert bad.returncode == 1 and "401" in bad.stderr and "--token" in bad.stderr
    assert cli("ls", "--token", "tok-alice", env={**env, "WSTRAIN_TOKEN": "x"}).returncode == 0


# ---------------------------------------------------------------- specs and sweeps


def test_relative_spec_paths_resolve_against_the_spec_files_directory(
    api_only: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    root = api_only.state_dir.parent  # a data root of the api_only server
    (root / "corpus").mkdir(exist_ok=True)
    (root / "corpus" / "docs.txt").write_bytes(CORPUS.read_bytes()[:20000])
    (root / "specs").mkdir(exist_ok=True)
    spec_file = root / "specs" / "rel.yaml"
    data = {"kind": "text", "path": "../corpus/docs.txt", "tokenizer": "byte"}
    spec = tiny_spec("relative-paths", data=data)
    spec_file.write_text(yaml.safe_dump(spec))
    unit = load_spec(str(spec_file))
    assert unit["data"] == {
        "kind": "text",
        "path": str(root / "corpus" / "docs.txt"),
        "tokenizer": "byte",  # a tokenizer name, not a path
    }
    monkeypatch.chdir(tmp_path)  # submitted from elsewhere: the spec's directory counts
    code, out, err = run_main(capsys, "--server", api_only.url, "submit", str(spec_file))
    assert code == 0, err
    with api_only.client() as c:
        job = c.get(f"/v1/jobs/{out.strip()}").json()
    assert job["spec"]["data"]["path"] == str(root / "corpus" / "docs.txt")
    helptext = subprocess.run(
        [sys.executable, "-m", "wstrain.cli.main", "submit", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "relative model.path, data.path" in " ".join(helptext.split())


def test_a_sweep_submits_the_product_in_one_group(
    api_only: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_spec("lr-sweep")))
    args = ["--server", api_only.url, "submit", str(spec_file)]
    sweep = ["--sweep", "optimizer.lr=1e-4,3e-4", "--sweep", "seed=0,1"]
    code, out, err = run_main(capsys, *args, *sweep)
    assert code == 0, err
    ids = out.split()
    assert len(ids) == 4 and "4 jobs" in err
    with api_only.client() as c:
        specs = [c.get(f"/v1/jobs/{i}").json()["spec"] for i in ids]
    assert [s["name"] for s in specs] == [f"lr-sweep-{i}" for i in range(4)]
    assert len({s["group"] for s in specs}) == 1 and specs[0]["group"].startswith("sweep-")
    points = [(s["optimizer"]["lr"], s["seed"]) for s in specs]
    assert points == [(1e-4, 0), (1e-4, 1), (3e-4, 0), (3e-4, 1)]
    before = _total(api_only)
    code, _, err = run_main(capsys, *args, "--sweep", f"seed={','.join(map(str, range(257)))}")
    assert code == 2 and "257 points" in err and "at most 256" in err
    code, _, err = run_main(capsys, *args, "--sweep", "optimizer.lr")
    assert code == 2 and "KEY=V1,V2" in err
    # a point the server refuses: the points before it are cancelled, and the error names it
    code, _, err = run_main(capsys, *args, "--sweep", "seq_len=32,0")
    assert code == 1 and "sweep point 1 (lr-sweep-1) refused" in err and "seq_len" in err
    with api_only.client() as c:
        listed = c.get("/v1/jobs", params={"limit": 5}).json()["jobs"]
    assert next(j["state"] for j in listed if j["name"] == "lr-sweep-0") == "cancelled"
    assert _total(api_only) == before + 1


# ---------------------------------------------------------------- logs, queue, tables


def _append_log(redis_url: str, prefix: str, job_id: str, lines: list[str]) -> None:
    async def go() -> None:
        store = JobStore.from_url(redis_url, prefix)
        await JobLogs.of(store).append(job_id, lines)
        await store.close()

    asyncio.run(go())


def _submit(stack: Stack, name: str, **over: Any) -> str:
    with stack.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec(name, **over))
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def test_logs_prints_the_log_and_follows_it_to_the_end(
    api_only: Stack, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _submit(api_only, "cli-logs")
    _append_log(redis_url, "apionly", job, ["first [bold]line[/]", "second line"])
    code, out, _ = run_main(capsys, "--server", api_only.url, "logs", job)
    assert (code, out) == (0, "first [bold]line[/]\nsecond line\n")  # no markup, verbatim
    follow = subprocess.Popen(
        [sys.executable, "-m", "wstrain.cli.main", "logs", "-f", job, "--server", api_only.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # the output must be the lines and nothing else
        text=True,
        cwd=REPO,
    )
    assert follow.stdout is not None
    assert follow.stdout.readline() == "first [bold]line[/]\n"
    _append_log(redis_url, "apionly", job, ["third line"])
    with api_only.client() as c:
        c.post(f"/v1/jobs/{job}/cancel")
    follow.wait(timeout=30)  # then read: communicate() would skip what readline() buffered
    out = follow.stdout.read()
    assert follow.returncode == 0 and out == "second line\nthird line\n"  # and no stderr


def test_logs_follow_survives_an_api_restart_without_losing_or_repeating_a_line(
    secured: Stack, redis_url: str
) -> None:
    with secured.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("cli-logs-restart"), headers=ALICE)
        job = r.json()["id"]
    _append_log(redis_url, "clisec", job, ["before the restart"])
    env = {**os.environ, "WSTRAIN_URL": secured.url, "WSTRAIN_TOKEN": "tok-alice"}
    follow = subprocess.Popen(
        [sys.executable, "-m", "wstrain.cli.main", "logs", "-f", job],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert follow.stdout is not None
    assert follow.stdout.readline() == "before the restart\n"
    secured.api.terminate()
    secured.api.wait(30)
    _append_log(redis_url, "clisec", job, ["while it was down"])
    secured.start_api()
    _append_log(redis_url, "clisec", job, ["after it came back"])
    with secured.client() as c:
        c.post(f"/v1/jobs/{job}/cancel", headers=ALICE)
    follow.wait(timeout=60)
    out = follow.stdout.read()
    assert follow.returncode == 0, out
    assert out == "while it was down\nafter it came back\n"


def test_ctrl_c_in_logs_follow_exits_0_quietly(api_only: Stack) -> None:
    job = _submit(api_only, "cli-logs-ctrl-c")
    with as_a_foreground_job():
        proc = subprocess.Popen(
            [sys.executable, "-m", "wstrain.cli.main", "--server", api_only.url, "logs", "-f", job],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            start_new_session=True,
        )
    time.sleep(2.0)  # connected and waiting for lines of a job that never runs
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == "" and err == ""


def test_queue_lists_waiting_jobs_in_run_order_with_reasons(
    api_only: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    low = _submit(api_only, "queue-low", priority=91)
    high = _submit(api_only, "queue-high", priority=93)
    low2 = _submit(api_only, "queue-low2", priority=91)
    code, out, err = run_main(capsys, "--server", api_only.url, "queue", "--json")
    assert code == 0, err
    jobs = json.loads(out)["jobs"]
    order = [j["id"] for j in jobs if j["id"] in (low, high, low2)]
    assert order == [high, low, low2]
    positions = [j["position"] for j in jobs]
    assert positions == sorted(positions) and all("state_reason" in j for j in jobs)
    code, out, _ = run_main(capsys, "--server", api_only.url, "queue")
    assert code == 0 and out.index(high) < out.index(low) < out.index(low2)
    assert "reason" in out


def test_ls_and_status_draw_tables_and_keep_json(
    api_only: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _submit(api_only, "cli-tables")
    code, out, _ = run_main(capsys, "--server", api_only.url, "ls", "--limit", "500")
    row = next(line for line in out.splitlines() if job in line)
    assert code == 0 and "queued" in row and "0/40" in row and "cli-tables" in row
    code, out, _ = run_main(capsys, "--server", api_only.url, "ls", "--json")
    assert job in {j["id"] for j in json.loads(out)["jobs"]}
    code, out, _ = run_main(capsys, "status", job, "--server", api_only.url)
    assert code == 0 and re.search(r"state\s+queued", out) and re.search(r"name\s+cli-tables", out)
    code, out, _ = run_main(capsys, "status", job, "--json", "--server", api_only.url)
    assert json.loads(out)["id"] == job
    code, _, err = run_main(capsys, "status", "nosuchjob000", "--server", api_only.url)
    assert code == 1 and "404" in err


def test_watch_of_an_ended_job_prints_its_state_and_exits_by_it(
    api_only: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _submit(api_only, "cli-watch-cancelled")
    with api_only.client() as c:
        c.post(f"/v1/jobs/{job}/cancel")
    code, out, _ = run_main(capsys, "--server", api_only.url, "watch", job)
    assert code == 1 and f"job {job} cancelled: step 0/40" in out


# ---------------------------------------------------------------- a real job


def _read_until(fd: int, pattern: re.Pattern[str], timeout_s: float) -> tuple[str, Any]:
    """Read a pty until `pattern` matches its text (ANSI codes dropped)."""
    raw, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                raw += os.read(fd, 65536)
            except OSError:  # the child closed the pty
                break
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode(errors="replace"))
        if (m := pattern.search(text)) is not None:
            return text, m
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode(errors="replace")), None


@pytest.mark.slow
def test_ctrl_c_in_submit_follow_detaches_and_the_job_keeps_running(
    stack: Stack, tmp_path: Path
) -> None:
    spec_file = tmp_path / "long.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_spec("cli-detach", steps=100_000)))
    master, slave = pty.openpty()  # a terminal: the rich bar, as a user sees it
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    with as_a_foreground_job():
        proc = subprocess.Popen(
            [sys.executable, "-m", "wstrain.cli.main", "submit", str(spec_file), "--follow"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=REPO,
            env={**os.environ, "WSTRAIN_URL": stack.url, "TERM": "xterm-256color"},
            start_new_session=True,  # its own process group, as a shell's foreground job
        )
    os.close(slave)
    try:
        text, m = _read_until(master, re.compile(r"step ([1-9]\d*)/100000"), 120)
        assert m is not None, text[-2000:]
        job_id = re.search(r"\b[0-9a-f]{12}\b", text).group(0)  # type: ignore[union-attr]
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0
        text, m = _read_until(master, re.compile(r"re-attach with `wstrain watch \w+`"), 10)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert m is not None, text[-2000:]
    assert f"detached; job {job_id} keeps running" in text
    assert "Traceback" not in text
    with stack.client() as c:
        time.sleep(2)  # a cancel sent by the CLI would have landed by now
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert job["state"] == "running", job
        wait_job(c, job_id, lambda j: j["step"] > job["step"])  # still training
        c.post(f"/v1/jobs/{job_id}/cancel")
        assert wait_terminal(c, job_id)["state"] == "cancelled"


@pytest.mark.slow
def test_watch_follows_a_real_job_to_success(stack: Stack, capsys: Any) -> None:
    job = _submit(stack, "cli-watch-ok", steps=40)
    code, out, err = run_main(capsys, "--server", stack.url, "watch", job)
    assert code == 0, err
    assert f"job {job} succeeded: step 40/40" in out and "loss" in out
    with httpx.Client(base_url=stack.url) as c:
        assert c.get(f"/v1/jobs/{job}").json()["state"] == "succeeded"
