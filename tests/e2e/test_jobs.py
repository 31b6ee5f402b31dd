"""End to end: real uvicorn + real agent + real worker processes on a real Redis. Jobs train
to completion, cancel and resume over HTTP bit-identically, survive an API restart, and a
SIGKILLed worker fails its job with the reason while the agent keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from tests.conftest import REPO, Stack, tiny_spec, wait_job, wait_terminal
from tests.helpers.jobs import checkpoint_weights

pytestmark = pytest.mark.slow


def test_job_trains_to_completion_with_falling_loss(stack: Stack) -> None:
    with stack.client() as c:
        spec = tiny_spec(
            "e2e-train",
            steps=150,
            checkpoint_every=50,
            eval={"heldout_fraction": 0.05, "every_steps": 50, "sequences": 4},
        )
        job = c.post("/v1/jobs", json=spec).json()
        seen_running = wait_job(c, job["id"], lambda j: j["state"] in ("running", "succeeded"))
        metrics_seen = False
        while (cur := c.get(f"/v1/jobs/{job['id']}").json())["state"] == "running":
            if cur["loss"] is not None and not metrics_seen:
                text = httpx.get(stack.metrics_url).text
                metrics_seen = f'wstrain_job_loss{{job="{job["id"]}"}}' in text
            time.sleep(0.05)
        done = wait_terminal(c, job["id"])
        assert done["state"] == "succeeded", done["error"]
        assert done["step"] == 150 and done["tokens_per_s"] > 0
        assert done["mfu"] is None  # a CPU job: no MFU without WSTRAIN_CPU_PEAK_FLOPS
        assert seen_running["node"] == "node-full"
        events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
        states = [e["data"]["state"] for e in events if e["kind"] == "state"]
        assert states == ["queued", "planning", "running", "succeeded"]
        losses = [e["data"]["loss"] for e in events if e["kind"] == "progress"]
        assert len(losses) >= 2 and losses[-1] < losses[0] - 1.0, losses
        ckpts = [e["data"]["step"] for e in events if e["kind"] == "checkpoint"]
        assert ckpts == [50, 100, 150]
        held_out = [e["data"] for e in events if e["kind"] == "eval"]
        assert [e["step"] for e in held_out] == [50, 100, 150]
        assert held_out[-1]["loss"] < held_out[0]["loss"] and done["eval_loss"] is not None
        assert Path(done["last_checkpoint"]).name == "step-00000150"
        assert metrics_seen or done["step"] == 150  # fast jobs may finish between scrapes


WS_OVERRIDES = {
    "runtime": "working_set",
    "micro_batch": 2,
    "window": 1,
    "r_param": 2,
    "r_grad": 1,
    "level": 1,
}


@pytest.mark.parametrize("runtime", ["resident", "working_set"])
def test_cancel_then_resume_is_bit_identical(stack: Stack, runtime: str) -> None:
    """Working set with the split AdamW: layer 0 and the embedding on the device optimizer,
    layer 1 and the head on the host thread, both deferred across the checkpoint."""
    ws = {**WS_OVERRIDES, "optimizer": "split"}
    # 200 steps: the cancel, sent once step 20 is reported, lands long before the end
    spec = dict(
        steps=200, seed=7, overrides=ws if runtime == "working_set" else {"runtime": "resident"}
    )
    with stack.client() as c:
        straight = c.post("/v1/jobs", json=tiny_spec(f"e2e-straight-{runtime}", **spec)).json()
        assert straight["plan"]["runtime"] == runtime
        if runtime == "working_set":
            plan_ws = straight["plan"]["working_set"]
            assert (plan_ws["optimizer"], plan_ws["device_layers"]) == ("split", 1)
        job = c.post("/v1/jobs", json=tiny_spec(f"e2e-cancelled-{runtime}", **spec)).json()
        wait_job(c, job["id"], lambda j: j["step"] >= 20)
        r = c.post(f"/v1/jobs/{job['id']}/cancel")
        assert r.status_code == 202 and r.json()["state"] in ("cancelling", "cancelled")
        cancelled = wait_terminal(c, job["id"])
        assert cancelled["state"] == "cancelled", cancelled
        stopped_at = int(Path(cancelled["last_checkpoint"]).name.split("-")[1])
        assert 20 <= stopped_at < 200, "the cancel must land mid-run for this test to mean much"
        r = c.post(f"/v1/jobs/{job['id']}/cancel")
        assert r.status_code == 409
        assert c.post(f"/v1/jobs/{job['id']}/resume").json()["attempt"] == 2
        resumed = wait_terminal(c, job["id"])
        assert resumed["state"] == "succeeded", resumed["error"]
        assert wait_terminal(c, straight["id"])["state"] == "succeeded"
        a, b = (
            checkpoint_weights(resumed),
            checkpoint_weights(c.get(f"/v1/jobs/{straight['id']}").json()),
        )
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].equal(b[name]), f"{name} differs after cancel+resume"
        events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
        # the worker said it had ended its step before it wrote the cancel's checkpoint
        stops = [e["message"] for e in events if e["kind"] == "stopping"]
        assert stops == [f"stopping at step {stopped_at}: writing its checkpoint"]
        at = [e["kind"] for e in events].index("stopping")
        saved = next(e["data"]["step"] for e in events[at:] if e["kind"] == "checkpoint")
        assert saved == stopped_at
        states = [e["data"]["state"] for e in events if e["kind"] == "state"]
        assert states == [
            "queued",
            "planning",
            "running",
            "cancelling",
            "cancelled",
            "queued",
            "planning",
            "running",
            "succeeded",
        ]


def test_sigkilled_worker_without_retries_fails_job_and_agent_keeps_serving(stack: Stack) -> None:
    with stack.client() as c:
        spec = tiny_spec("e2e-kill", steps=3000, checkpoint_every=20, max_retries=0)
        job = c.post("/v1/jobs", json=spec).json()
        running = wait_job(c, job["id"], lambda j: j["last_checkpoint"] is not None)
        os.kill(running["worker_pid"], signal.SIGKILL)
        failed = wait_terminal(c, job["id"])
        assert failed["state"] == "failed" and "SIGKILL" in failed["error"]
        other = c.post("/v1/jobs", json=tiny_spec("e2e-after-kill", steps=20)).json()
        assert wait_terminal(c, other["id"])["state"] == "succeeded"
        resumed = c.post(f"/v1/jobs/{job['id']}/resume").json()
        # the reply is the job as stored when it is sent: the idle agent may claim it first
        assert resumed["state"] in ("queued", "planning", "running")
        assert resumed["attempt"] == failed["attempt"] + 1 and resumed["error"] is None
        wait_job(c, job["id"], lambda j: j["state"] == "running")
        r = c.post(f"/v1/jobs/{job['id']}/resume")
        assert r.status_code == 409 and "only cancelled, failed or timed-out" in r.text
        c.post(f"/v1/jobs/{job['id']}/cancel")
        assert wait_terminal(c, job["id"])["state"] == "cancelled"
        events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
        resumed_from = [e["message"] for e in events if "resumed by" in e["message"]]
        assert resumed_from and "step-" in resumed_from[0]  # it resumed from a checkpoint


def test_api_restart_mid_job_loses_nothing(stack: Stack) -> None:
    with stack.client() as c:
        job = c.post("/v1/jobs", json=tiny_spec("e2e-api-restart", steps=400)).json()
        wait_job(c, job["id"], lambda j: j["step"] >= 10)
    stack.api.terminate()
    stack.api.wait(30)
    stack.start_api()
    with stack.client() as c:
        done = wait_terminal(c, job["id"])
        assert done["state"] == "succeeded" and done["step"] == 400


def test_cli_against_the_running_service(stack: Stack, tmp_path: Path) -> None:
    import yaml

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "wstrain.cli.main", "--server", stack.url, *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(tiny_spec("e2e-cli", steps=30)))
    plan = cli("plan", str(spec_file))
    assert plan.returncode == 0 and "micro_batch" in plan.stdout, plan.stderr
    sub = cli("submit", str(spec_file), "--follow")
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.splitlines()[0]
    assert "succeeded" in sub.stdout or "training finished" in sub.stdout
    st = cli("status", job_id)
    assert st.returncode == 0 and "succeeded" in st.stdout
    assert job_id in cli("ls").stdout
    presets = cli("presets")
    assert presets.returncode == 0, presets.stderr
    olmoe = next(ln for ln in presets.stdout.splitlines() if ln.startswith("olmoe-7b-a1b"))
    assert "OlmoeForCausalLM" in olmoe and "8/64" in olmoe and "6.919B" in olmoe, olmoe
    bad = cli("cancel", job_id)
    assert bad.returncode == 1 and "already succeeded" in bad.stderr
    spec_file.write_text(yaml.safe_dump(tiny_spec("e2e-cli", seq_len=0)))
    bad = cli("submit", str(spec_file))
    assert bad.returncode == 1 and "seq_len" in bad.stderr
    spec_file.write_text("[unclosed")
    assert cli("submit", str(spec_file)).returncode == 2


def test_working_set_telemetry_reaches_metrics(stack: Stack) -> None:
    spec = tiny_spec("e2e-telemetry", steps=3000, overrides=WS_OVERRIDES)
    with stack.client() as c:
        job = c.post("/v1/jobs", json=spec).json()
        live = wait_job(c, job["id"], lambda j: j["telemetry"].get("transfer_bytes_total.h2d"))
        tel = live["telemetry"]
        assert tel["host_arena_bytes"] > 0 and tel["host_rss_bytes"] > 0
        assert tel["transfer_bytes_total.d2h"] > 0 and "stall_seconds_total.optimizer" in tel
        text = httpx.get(stack.metrics_url).text
        jid = job["id"]
        for line in (
            f'wstrain_job_transfer_bytes_total{{direction="h2d",job="{jid}"}}',
            f'wstrain_job_host_arena_bytes{{job="{jid}"}}',
            f'wstrain_job_stall_seconds_total{{job="{jid}",reason="optimizer"}}',
            f'wstrain_job_steps_total{{job="{jid}"}}',
        ):
            assert line in text, line
        c.post(f"/v1/jobs/{jid}/cancel")
        assert wait_terminal(c, jid)["state"] == "cancelled"
    # The worker's exit drops the job's series before the job's state changes: the first
    # scrape after the API says "cancelled" has none of them.
    assert f'job="{jid}"' not in httpx.get(stack.metrics_url).text


def _trains_on_the_working_set(stack: Stack, spec: dict) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """Submit `spec`, check it is planned onto the working set, succeeds and its loss falls;
    (its plan, its last checkpoint's weights)."""
    with stack.client() as c:
        job = c.post("/v1/jobs", json=spec).json()
        assert job["plan"]["runtime"] == "working_set", job
        done = wait_terminal(c, job["id"])
        assert done["state"] == "succeeded", done["error"]
        events = c.get(f"/v1/jobs/{job['id']}/events", params={"limit": 1000}).json()
    losses = [e["data"]["loss"] for e in events if e["kind"] == "progress"]
    assert len(losses) >= 2 and losses[-1] < losses[0] - 0.5, losses
    return job["plan"], checkpoint_weights(done)


def test_moe_job_trains_on_the_working_set(stack: Stack) -> None:
    """A mixture-of-experts preset through the whole service: planned onto the working set,
    trained with the load-balancing loss, checkpointed with one tensor per expert."""
    spec = tiny_spec(
        "e2e-moe",
        model={"preset": "tiny-olmoe"},
        steps=60,
        overrides={"runtime": "working_set", "level": 2},
    )
    _, weights = _trains_on_the_working_set(stack, spec)
    assert "model.layers.3.mlp.experts.7.down_proj.weight" in weights
    assert "model.layers.0.mlp.gate.weight" in weights


def test_mixed_precision_job_trains_on_the_working_set(stack: Stack) -> None:
    """precision "mixed" through the whole service: bf16 weights stream to the layers, the
    host AdamW steps an fp32 master, and the checkpoint holds that master in fp32."""
    spec = tiny_spec("e2e-mixed", precision="mixed", steps=60, overrides=WS_OVERRIDES)
    plan, weights = _trains_on_the_working_set(stack, spec)
    assert plan["working_set"]["optimizer"] == "host"
    assert weights["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float32


def test_long_sequences_in_pieces_train_like_whole_ones(stack: Stack) -> None:
    """Long context through the whole service: a job whose sequences run in pieces
    (overrides.seq_chunk) is planned so (the plan names the piece and the kernel) and ends
    with the weights of the same job on whole sequences (fp32): the pieces change the
    memory, never the math."""
    base = dict(seq_len=256, steps=30, seed=3)
    with stack.client() as c:
        jobs = [
            c.post(
                "/v1/jobs",
                json=tiny_spec(
                    f"e2e-pieces-{n}", **base, overrides={**WS_OVERRIDES, "seq_chunk": n}
                ),
            ).json()
            for n in (64, 0)
        ]
        plan = jobs[0]["plan"]["working_set"]
        assert (plan["seq_chunk"], plan["attention_kernel"]) == (64, "reference-lse-merge")
        assert len(plan["levels"][0]) == 2 * 4  # (sequence, piece) units
        assert jobs[1]["plan"]["working_set"]["seq_chunk"] == 0
        done = [wait_terminal(c, j["id"]) for j in jobs]
    assert all(d["state"] == "succeeded" for d in done), [d["error"] for d in done]
    pieces, whole = (checkpoint_weights(d) for d in done)
    # fp32 sums in another order differ by ~1e-7 a step; 30 AdamW steps (lr 3e-3) grow that
    # to 1.05e-5 in one suite run (k_proj of layer 0): the whole job's plan follows the
    # profile the agent measures, so its order varies by run. A piece's mask or merge is
    # checked tightly at one step in tests/worker/runtime/working_set/test_sequence_chunks.py
    for name, w in whole.items():
        err = float((pieces[name] - w).norm() / w.norm().clamp_min(1e-30))
        assert err < 5e-5, (name, err)


def test_fp8_saved_activations_train_through_the_service(stack: Stack) -> None:
    """activation_precision "fp8" (bf16 job): planned with it (the reasons say so), trains,
    and the loss falls."""
    spec = tiny_spec(
        "e2e-fp8", precision="bf16", activation_precision="fp8", steps=60, overrides=WS_OVERRIDES
    )
    plan, _ = _trains_on_the_working_set(stack, spec)
    assert plan["reasons"]["activation_precision"].startswith("fp8")
