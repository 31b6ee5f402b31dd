"""`wstrain report`: the page rendered from hand-built events (every plot a real PNG, strings
escaped, the capped-log note), and end to end: a real working-set CPU job through the real
stack, the real CLI as a subprocess, and the page opened in headless Chromium, whose DevTools
protocol says every plot decoded.

    pytest tests/cli/test_report.py -m "not slow"   # the rendering only, ~2 s
    pytest tests/cli/test_report.py                 # + a real job and Chromium, ~25 s
"""

from __future__ import annotations

import base64
import json
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.conftest import REPO, Stack, tiny_spec, wait_terminal
from wstrain.cli.report import render

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
HOSTILE = "<script>alert(1)</script>"
WS = {"runtime": "working_set", "micro_batch": 2, "window": 1, "r_param": 2, "r_grad": 1}
GIB = 1 << 30
# The worker reports a step at most every 0.2 s (and always the last), so the page needs only
# a second of steps for its >= 5 points a line: 300 working-set steps take 2.4 s at the 8 ms a
# step of an idle 2-core machine (12 reports) and ~12 s at the ~40 ms of a busy one (~60),
# with 6 held-out evaluations either way
STEPS = 300


def _job(name: str, device: str) -> dict[str, Any]:
    return {
        "id": "j-report",
        "name": name,
        "owner": "alice",
        "state": "succeeded",
        "attempt": 1,
        "step": 12,
        "steps": 12,
        "loss": 2.5,
        "eval_loss": 2.7,
        "tokens_per_s": 1000.0,
        "node": "n1",
        "created_at": 1.7e9,
        "updated_at": 1.7e9 + 60,
        "last_checkpoint": "/ckpt/step-00000012",
        "error": None,
        "spec": {"budget": {"device_gib": 1.0, "host_gib": 2.0}},
        "plan": {"runtime": "working_set", "device": device},
    }


def _events(gpu: bool, submitted: bool) -> list[dict[str, Any]]:
    evs: list[dict[str, Any]] = []
    if submitted:
        evs.append({"kind": "state", "data": {"state": "queued"}})
    evs.append({"kind": "started", "data": {"step": 0}})
    for step in range(1, 13):
        metrics = {
            "stall_seconds_total.weights": 0.01 * step,
            "stall_seconds_total.gradients": 0.002 * step,
            "transfer_bytes_total.h2d": 1e8 * step,
            "transfer_bytes_total.d2h": 5e7 * step,
            "transfer_bandwidth.h2d": 2e9,
            "transfer_bandwidth.d2h": 1e9,
            "host_rss_bytes": 0.5 * GIB,
            "host_arena_bytes": 0.3 * GIB,
            "host_pinned_bytes": 0.1 * GIB,
        }
        data = {"step": step, "loss": 5.0 - 0.2 * step, "tokens_per_s": 900.0 + step}
        if gpu:  # the older spelling of the device-memory peaks, still in old event logs
            metrics |= {"device_memory.peak_allocated": 0.4 * GIB}
            metrics |= {"device_memory.peak_reserved": 0.6 * GIB}
            data["mfu"] = 0.3
        else:
            metrics["device_memory_bytes.process_rss"] = 0.55 * GIB
        evs.append({"kind": "progress", "data": data | {"metrics": metrics}})
        if step % 4 == 0:
            evs.append({"kind": "eval", "data": {"step": step, "loss": 5.1 - 0.2 * step}})
    return [{"id": f"{i}-0", "ts": 1.7e9 + i, "message": "", **e} for i, e in enumerate(evs)]


def _pngs(page: str) -> list[bytes]:
    return [base64.b64decode(b64) for b64 in IMG.findall(page)]


def test_gpu_page_has_seven_png_plots_and_escapes_the_name() -> None:
    page = render(_job(f"run-{HOSTILE}", "cuda"), _events(gpu=True, submitted=True))
    pngs = _pngs(page)
    assert len(pngs) == 7, "loss, tokens/s, MFU, stalls, transfers, host and device memory"
    assert all(p.startswith(PNG_SIGNATURE) and len(p) > 2000 for p in pngs)
    assert page.count("<img") == 7 and "<script" not in page
    assert "run-&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "no MFU" not in page and "newest 10,000 events" not in page


def test_cpu_page_says_why_no_mfu_and_that_the_log_was_capped() -> None:
    page = render(_job("cpu-run", "cpu"), _events(gpu=False, submitted=False))
    assert all(p.startswith(PNG_SIGNATURE) for p in _pngs(page)) and len(_pngs(page)) == 6
    assert "no MFU: CPU job (no peak FLOP/s)" in page
    assert "newest 10,000 events" in page  # the submission event is gone: the stream was capped


def test_a_job_with_no_progress_says_so() -> None:
    page = render(
        _job("early", "cpu"),
        [{"id": "1-0", "ts": 1.7e9, "kind": "state", "message": "", "data": {"state": "queued"}}],
    )
    assert "<img" not in page and "No progress events yet" in page


def _cli_env(stack: Stack) -> dict[str, str]:
    env = {**stack.env, "WSTRAIN_URL": stack.url}
    env.pop("WSTRAIN_TOKEN", None)  # the test stack runs without auth
    return env


def _cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wstrain.cli.main", *args],
        env=_cli_env(stack),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _cli_start(stack: Stack, *args: str) -> subprocess.Popen[str]:
    """The CLI started in the background; communicate() collects its output."""
    return subprocess.Popen(
        [sys.executable, "-m", "wstrain.cli.main", *args],
        env=_cli_env(stack),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def chromium(page: Path, profile: Path, timeout_s: float = 60) -> Iterator[Callable[[str], Any]]:
    """Headless Chromium on `page`; yields evaluate(expression) -> its value, through the
    Chrome DevTools Protocol's Runtime.evaluate on the page's target."""
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium is not installed; scripts/setup.sh installs it for the tests")
    args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0"]
    proc = subprocess.Popen(
        [exe, *args, f"--user-data-dir={profile}", page.as_uri()],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines: queue.Queue[str] = queue.Queue()

        def drain() -> None:  # for Chromium's whole life: a full stderr pipe would block it
            for line in proc.stderr or []:
                lines.put(line)

        threading.Thread(target=drain, daemon=True).start()
        deadline, browser_ws = time.monotonic() + timeout_s, ""
        while not browser_ws:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"chromium printed no DevTools URL in {timeout_s} s")
            if m := re.search(r"DevTools listening on (ws://\S+)", line):
                browser_ws = m.group(1)
        port = browser_ws.split(":")[2].split("/")[0]
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page_ws = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        with connect(page_ws, max_size=None, open_timeout=timeout_s) as ws:
            ids = iter(range(1, 1 << 30))

            def evaluate(expression: str) -> Any:
                call_id, params = next(ids), {"expression": expression, "returnByValue": True}
                ws.send(json.dumps({"id": call_id, "method": "Runtime.evaluate", "params": params}))
                while (reply := json.loads(ws.recv(timeout=30))).get("id") != call_id:
                    pass  # an event of the page, not asked for
                return reply["result"]["result"].get("value")

            yield evaluate
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
def test_report_of_a_real_job_renders_in_chromium(stack: Stack, tmp_path: Path) -> None:
    with stack.client() as c:
        spec = tiny_spec(
            "report-ws",
            steps=STEPS,
            overrides=WS,
            eval={"heldout_fraction": 0.1, "every_steps": 50, "sequences": 2},
        )
        # the owner header is free text without auth: a string the page must escape (a job
        # name cannot hold `<`: JobSpec's pattern refuses it)
        r = c.post("/v1/jobs", json=spec, headers={"X-Wstrain-Owner": HOSTILE})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        # the CLI's 404 (its own Python and httpx start) while the worker starts and trains
        missing_out = tmp_path / "x.html"
        missing = _cli_start(stack, "report", "no-such-job", "-o", str(missing_out))
        done = wait_terminal(c, jid)
        assert done["state"] == "succeeded", done["error"]
        events = c.get(f"/v1/jobs/{jid}/events", params={"limit": 1000}).json()
    progress = [e["data"] for e in events if e["kind"] == "progress"]
    assert len(progress) >= 5 and progress[-1]["step"] == STEPS
    assert {"stall_seconds_total.weights", "transfer_bytes_total.h2d"} <= set(
        progress[-1]["metrics"]
    )
    has_mfu = any("mfu" in p for p in progress)

    _, missing_err = missing.communicate(timeout=120)
    assert missing.returncode == 1 and "404" in missing_err and "no-such-job" in missing_err
    assert not missing_out.exists()

    out = tmp_path / "report.html"
    run = _cli(stack, "report", jid, "-o", str(out))
    assert run.returncode == 0, run.stderr
    page = out.read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script" not in page
    expected = 7 if has_mfu else 6  # loss, tokens/s, [MFU], stalls, transfers, host, device
    assert len(_pngs(page)) == expected
    assert has_mfu or "no MFU: CPU job (no peak FLOP/s)" in page

    with chromium(out, tmp_path / "chromium-profile") as evaluate:
        deadline = time.monotonic() + 30
        # the target is about:blank, "complete", until Chromium has navigated to the file
        loaded = f"location.href === {json.dumps(out.as_uri())} && document.readyState"
        while evaluate(loaded) != "complete":
            assert time.monotonic() < deadline, "the report did not finish loading in 30 s"
            time.sleep(0.1)
        images = evaluate(
            "Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
        )
        text = evaluate("document.body.innerText")
        scripts = evaluate("document.scripts.length")
    assert len(images) == expected, images
    assert all(ok and w > 0 and h > 0 for ok, w, h in images), images
    assert jid in text and HOSTILE in text and scripts == 0  # shown as text, never run
    assert f"{STEPS}/{STEPS}" in text and "working_set on cpu" in text
