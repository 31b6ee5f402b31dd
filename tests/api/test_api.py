"""The REST API against a real uvicorn and a real Redis: every endpoint, bad input, and the
queue-side state transitions (an API with no agent keeps jobs queued)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, Stack, tiny_spec
from wstrain.contracts.jobs import JobList
from wstrain.contracts.spec import OptimizerSpec


def _total(c: httpx.Client) -> int:
    return int(c.get("/v1/jobs", params={"limit": 1}).json()["total"])


def test_health_ready_docs(api_only: Stack) -> None:
    with api_only.client() as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json() == {"status": "ready"}
        assert c.get("/docs").status_code == 200
        paths = c.get("/openapi.json").json()["paths"]
        for p in (
            "/v1/jobs",
            "/v1/jobs/{job_id}",
            "/v1/jobs/{job_id}/plan",
            "/v1/jobs/{job_id}/events",
            "/v1/jobs/{job_id}/cancel",
            "/v1/jobs/{job_id}/resume",
            "/v1/plans",
            "/v1/nodes",
        ):
            assert p in paths


def test_submit_returns_queued_job_with_plan(api_only: Stack) -> None:
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("submit-ok"), headers={"X-Wstrain-Owner": "ann"})
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["state"] == "queued" and job["owner"] == "ann" and job["attempt"] == 1
        assert job["step"] == 0 and job["steps"] == 40 and job["loss"] is None
        plan = c.get(f"/v1/jobs/{job['id']}/plan").json()
        assert plan["micro_batch"] * plan["rounds"] == 4
        assert plan["predicted"]["peak_device_bytes"] <= 1 << 30
        assert set(plan["reasons"]) >= {"micro_batch", "rounds", "window"}
        events = c.get(f"/v1/jobs/{job['id']}/events").json()
        assert [e["kind"] for e in events] == ["state"] and "queued" in events[0]["message"]


def test_dry_run_plan_queues_nothing(api_only: Stack) -> None:
    with api_only.client() as c:
        before = _total(c)
        r = c.post("/v1/plans", json=tiny_spec("dry", global_batch=8))
        assert r.status_code == 200
        assert r.json()["micro_batch"] * r.json()["rounds"] == 8
        assert _total(c) == before


# a small OLMoE config.json as transformers writes it
MOE_HF = {
    "model_type": "olmoe",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.01,
    "output_router_logits": True,
    "max_position_embeddings": 1024,
}


def _bad(**over: Any) -> dict[str, Any]:
    return tiny_spec("bad", **over)


BAD_SPECS = {
    "unknown top-level field": ({**tiny_spec("bad"), "learning_rate": 1}, "learning_rate"),
    "unknown nested field": (_bad(budget={"device_gib": 1, "host_gib": 1, "gpu": 1}), "gpu"),
    "zero device budget": (_bad(budget={"device_gib": 0, "host_gib": 1}), "device_gib"),
    "negative host budget": (_bad(budget={"device_gib": 1, "host_gib": -2}), "host_gib"),
    "seq_len zero": (_bad(seq_len=0), "seq_len"),
    "negative steps": (_bad(steps=-1), "steps"),
    "unknown preset": (_bad(model={"preset": "gpt-17"}), "gpt-17"),
    "missing data file": (
        _bad(data={"kind": "text", "path": str(REPO / "nope.txt")}),
        "does not exist",
    ),
    "data outside roots": (
        _bad(data={"kind": "text", "path": "/etc/hostname"}),
        "outside the data roots",
    ),
    "micro_batch override not dividing": (_bad(overrides={"micro_batch": 3}), "divide"),
    "MoE with more experts per token than experts": (
        _bad(model={"hf_config": {**MOE_HF, "num_experts_per_tok": 9}}),
        "num_experts_per_tok=9",
    ),
    "dense layers among MoE layers": (
        _bad(model={"hf_config": {**MOE_HF, "mlp_only_layers": [0]}}),
        "mlp_only_layers",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_specs_get_422_and_leave_nothing(api_only: Stack, case: str) -> None:
    spec, needle = BAD_SPECS[case]
    with api_only.client() as c:
        before = _total(c)
        for path in ("/v1/jobs", "/v1/plans"):
            r = c.post(path, json=spec)
            assert r.status_code == 422, (case, r.text)
            assert needle in r.text, (case, r.text)
        assert _total(c) == before


def test_token_files_are_checked_before_anything_is_queued(api_only: Stack) -> None:
    """micro-llama has vocab 256: .bin and .npy token files, good and bad."""
    import numpy as np

    root = api_only.state_dir.parent
    ids = np.arange(4096) % 256
    np.asarray(ids, dtype=np.uint16).tofile(root / "good.bin")
    np.save(root / "good.npy", np.asarray(ids, dtype=np.uint32))
    np.asarray([*ids[:1000], 300, *ids[:100]], dtype=np.uint16).tofile(root / "big-id.bin")
    np.save(root / "float.npy", ids.astype(np.float32))
    np.asarray(ids[:20], dtype=np.uint16).tofile(root / "short.bin")
    (root / "odd.bin").write_bytes(b"\x01\x02\x03")
    cases = {
        "good.bin": ("uint16", None),
        "good.npy": ("uint32", None),
        "big-id.bin": ("uint16", "vocab_size 256 (the first at position 1000)"),
        "float.npy": ("uint32", "holds float32 tokens"),
        "good.npy#": ("uint16", "set data.dtype to match"),
        "short.bin": ("uint16", "fewer than one sequence"),
        "odd.bin": ("uint32", "not a multiple of 4"),
    }
    with api_only.client() as c:
        before = _total(c)
        for name, (dtype, needle) in cases.items():
            data = {"kind": "tokens", "path": str(root / name.rstrip("#")), "dtype": dtype}
            r = c.post("/v1/plans", json=tiny_spec("tok", data=data))
            if needle is None:
                assert r.status_code == 200, (name, r.text)
            else:
                assert r.status_code == 422 and needle in r.text, (name, r.text)
        data = {"kind": "tokens", "path": str(root / "good.bin"), "dtype": "uint16"}
        r = c.post("/v1/plans", json=tiny_spec("tok", data=data, eval={"heldout_fraction": 0.005}))
        assert r.status_code == 422 and "leaves 20, fewer than one sequence" in r.text
        assert _total(c) == before


def test_prepared_token_files_are_checked_by_their_header(api_only: Stack) -> None:
    """A prepared file: dtype from its header; an unfinished one, a header that disagrees
    with the file or a tokenizer larger than the model's vocabulary is a 422."""
    from wstrain.prepare.pipeline import PrepareRequest, prepare

    root = api_only.state_dir.parent / "prepared"
    root.mkdir(exist_ok=True)
    (root / "docs.jsonl").write_text("".join(f'{{"text": "doc {i} " }}\n' * 40 for i in range(9)))
    header = prepare(PrepareRequest(str(root / "docs.jsonl"), str(root / "docs.bin")))
    data = {"kind": "tokens", "path": str(root / "docs.bin")}
    with api_only.client() as c:
        before = _total(c)
        assert c.post("/v1/plans", json=tiny_spec("p", data=data)).status_code == 200
        r = c.post("/v1/plans", json=tiny_spec("p", data={**data, "dtype": "uint32"}))
        assert r.status_code == 422 and "leave data.dtype out" in r.text
        headers = {
            "complete: false": ({"complete": False}, "run the same `wstrain prepare` again"),
            "tokens": ({"tokens": header.tokens + 1}, "as its header says"),
            "vocab": ({"vocab_size": 50_000}, "larger than the model's vocab_size 256"),
        }
        for name, (change, needle) in headers.items():
            (root / "docs.json").write_text(header.model_copy(update=change).model_dump_json())
            r = c.post("/v1/plans", json=tiny_spec("p", data=data))
            assert r.status_code == 422 and needle in r.text, (name, r.text)
        assert _total(c) == before


def test_raw_text_over_64_mib_is_refused_with_the_prepare_command(api_only: Stack) -> None:
    big = api_only.state_dir.parent / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: its size is what the API looks at
    with api_only.client() as c:
        r = c.post("/v1/plans", json=tiny_spec("big", data={"kind": "text", "path": str(big)}))
    assert r.status_code == 422, r.text
    assert f"wstrain prepare {big} {big.with_suffix('')}.bin --tokenizer byte" in r.text


def test_jsonl_text_is_checked_line_by_line(api_only: Stack) -> None:
    from tests.helpers.tokenizers import word_tokenizer_json

    root = api_only.state_dir.parent
    (root / "docs.jsonl").write_text(
        "\n".join(f'{{"text": "{"a b c d " * 20}"}}' for _ in range(10)) + "\n"
    )
    (root / "broken.jsonl").write_text('{"text": "a"}\n{"text": 3}\n')
    tok = word_tokenizer_json(root)
    (root / "no-eos").mkdir(exist_ok=True)
    plain = root / "no-eos" / "tokenizer.json"
    raw = json.loads(tok.read_text())
    raw["added_tokens"] = []
    plain.write_text(json.dumps(raw))
    with api_only.client() as c:
        before = _total(c)
        ok = {"kind": "text", "path": str(root / "docs.jsonl"), "tokenizer": str(tok)}
        assert c.post("/v1/plans", json=tiny_spec("j", data=ok)).status_code == 200
        r = c.post(
            "/v1/plans", json=tiny_spec("j", data={**ok, "path": str(root / "broken.jsonl")})
        )
        assert r.status_code == 422 and "line 2" in r.text
        r = c.post("/v1/plans", json=tiny_spec("j", data={**ok, "tokenizer": str(plain)}))
        assert r.status_code == 422 and "end-of-text" in r.text
        assert _total(c) == before


def test_infeasible_budget_names_the_minimum(api_only: Stack) -> None:
    spec = tiny_spec(
        "big",
        model={"preset": "tiny-llama"},
        seq_len=1024,
        global_batch=8,
        budget={"device_gib": 0.01, "host_gib": 8},
    )
    with api_only.client() as c:
        before = _total(c)
        r = c.post("/v1/jobs", json=spec)
        assert r.status_code == 422
        need = r.json()["min_budget"]
        assert need["device_gib"] > 0.01 and need["host_gib"] > 0
        assert "raise the budget" in r.json()["detail"]
        assert _total(c) == before
        # The minimum it names really works, and a little less does not.
        spec["budget"] = dict(need)
        assert c.post("/v1/plans", json=spec).status_code == 200
        spec["budget"] = {"device_gib": need["device_gib"] - 0.02, "host_gib": need["host_gib"]}
        assert c.post("/v1/plans", json=spec).status_code == 422


def test_budget_larger_than_any_node(api_only: Stack) -> None:
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=_bad(budget={"device_gib": 4096, "host_gib": 1}))
        assert r.status_code == 422 and "larger than any node" in r.text


def test_unknown_job_is_404(api_only: Stack) -> None:
    with api_only.client() as c:
        for method, path in (
            ("GET", "/v1/jobs/nope"),
            ("GET", "/v1/jobs/nope/plan"),
            ("GET", "/v1/jobs/nope/events"),
            ("POST", "/v1/jobs/nope/cancel"),
            ("POST", "/v1/jobs/nope/resume"),
        ):
            r = c.request(method, path)
            assert r.status_code == 404 and "does not exist" in r.text


def test_queued_cancel_resume_cycle(api_only: Stack) -> None:
    with api_only.client() as c:
        job = c.post("/v1/jobs", json=tiny_spec("cycle")).json()
        jid = job["id"]
        r = c.post(f"/v1/jobs/{jid}/resume")
        assert r.status_code == 409 and "only cancelled, failed or timed-out" in r.text
        r = c.post(f"/v1/jobs/{jid}/cancel")
        assert r.status_code == 202 and r.json()["state"] == "cancelled"
        r = c.post(f"/v1/jobs/{jid}/cancel")
        assert r.status_code == 409 and "already cancelled" in r.text
        r = c.post(f"/v1/jobs/{jid}/resume")
        assert r.status_code == 202
        assert r.json()["state"] == "queued" and r.json()["attempt"] == 2
        states = [e["data"].get("state") for e in c.get(f"/v1/jobs/{jid}/events").json()]
        assert states == ["queued", "cancelled", "queued"]


def test_list_filters_and_pages(api_only: Stack) -> None:
    with api_only.client() as c:
        ids = [
            c.post(
                "/v1/jobs", json=tiny_spec(f"page{i}"), headers={"X-Wstrain-Owner": "pager"}
            ).json()["id"]
            for i in range(3)
        ]
        c.post(f"/v1/jobs/{ids[0]}/cancel")
        mine = c.get("/v1/jobs", params={"owner": "pager"}).json()
        assert mine["total"] == 3 and [j["id"] for j in mine["jobs"]] == ids[::-1]
        page = c.get("/v1/jobs", params={"owner": "pager", "limit": 2, "offset": 2}).json()
        assert [j["id"] for j in page["jobs"]] == [ids[0]]
        assert JobList.model_validate(page).model_dump(mode="json") == page  # the schema, exactly
        assert page["jobs"][0]["state"] == "cancelled" and page["jobs"][0]["plan"] is None
        cancelled = c.get("/v1/jobs", params={"state": "cancelled"}).json()["jobs"]
        assert ids[0] in [j["id"] for j in cancelled]
        assert c.get("/v1/jobs", params={"state": "bogus"}).status_code == 422


def test_api_restart_loses_nothing(api_only: Stack) -> None:
    with api_only.client() as c:
        job = c.post("/v1/jobs", json=tiny_spec("restart")).json()
    api_only.api.terminate()
    api_only.api.wait(30)
    api_only.start_api()
    with api_only.client() as c:
        again = c.get(f"/v1/jobs/{job['id']}").json()
        assert again["state"] == "queued" and again["spec"] == job["spec"]


def test_presets_list_table_1_models_with_their_sizes(api_only: Stack) -> None:
    with api_only.client() as c:
        presets = {p["name"]: p for p in c.get("/v1/presets").json()["presets"]}
    assert {"llama3-8b", "dense-15b", "qwen3-32b", "tiny-qwen3"} <= set(presets)
    q = presets["qwen3-32b"]
    assert (q["architecture"], q["layers"], q["hidden_size"], q["heads"]) == (
        "Qwen3ForCausalLM",
        64,
        5120,
        40,
    )
    assert 32e9 < q["params_total"] < 33.5e9
    assert q["training_state_bytes"]["bf16"] == 8 * q["params_total"]
    moe = presets["qwen3-30b-a3b"]  # 30.5 B parameters, 3.3 B of them active
    assert (moe["architecture"], moe["experts"], moe["experts_per_token"]) == (
        "Qwen3MoeForCausalLM",
        128,
        8,
    )
    assert 30e9 < moe["params_total"] < 31e9 and 3e9 < moe["params_active"] < 3.5e9
    assert {"olmoe-7b-a1b", "sparse-16b-a3b"} <= set(presets)


def test_moe_hf_config_plans_with_active_parameters(api_only: Stack) -> None:
    spec = tiny_spec("moe", model={"hf_config": MOE_HF}, data={"kind": "synthetic"})
    with api_only.client() as c:
        r = c.post("/v1/plans", json=spec)
    assert r.status_code == 200, r.text
    # per layer: q, k, v, o 4·64·64 = 16384; 8 experts 8·3·64·32 = 49152; router 8·64 = 512;
    # norms 2·64 + OLMoE's q/k norms over whole projections 2·64: 66304. Two layers, the
    # embedding and the head 2·256·64, the final norm 64: 165440 (all experts: Ψ_total).
    assert r.json()["params"] == 165_440


def test_metrics_expose_queue_and_jobs(api_only: Stack) -> None:
    with api_only.client() as c:
        c.post("/v1/jobs", json=tiny_spec("metric"))
        text = c.get("/metrics").text
    assert 'wstrain_jobs{state="queued"}' in text
    depth = [ln for ln in text.splitlines() if ln.startswith("wstrain_queue_depth ")]
    assert depth and float(depth[0].split()[1]) >= 1
    assert "wstrain_api_request_duration_seconds_bucket" in text


def test_small_budget_gets_a_working_set_plan(api_only: Stack) -> None:
    """A 1.1 B-parameter model: resident at 14 GiB, working set at 3 GiB."""
    hf = {
        "vocab_size": 32000,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "max_position_embeddings": 4096,
    }
    spec = tiny_spec(
        "ws",
        model={"hf_config": hf},
        seq_len=2048,
        global_batch=8,
        precision="bf16",
        data={"kind": "synthetic"},
        budget={"device_gib": 14, "host_gib": 14},
    )
    with api_only.client() as c:
        assert c.post("/v1/plans", json=spec).json()["runtime"] == "resident"
        spec["budget"] = {"device_gib": 3, "host_gib": 14}
        tight = c.post("/v1/plans", json=spec).json()
        assert tight["runtime"] == "working_set", tight
        assert tight["predicted"]["peak_device_bytes"] <= 3 * 2**30
        assert tight["predicted"]["peak_host_bytes"] <= 14 * 2**30
        assert tight["working_set"]["r_param"] >= 2 and "window" in tight["reasons"]
        spec["overrides"] = {"runtime": "working_set", "window": 99}
        r = c.post("/v1/plans", json=spec)
        assert r.status_code == 422 and "overrides.window=99 exceeds" in r.text
        # mixed: an fp32 master and fp32 moments on the host, updated there (8 layers, so the
        # 16 bytes a parameter fit the nodes' 16 GiB)
        spec["model"]["hf_config"]["num_hidden_layers"] = 8
        spec["overrides"] = {}
        pure = c.post("/v1/plans", json=spec).json()
        spec["precision"] = "mixed"
        mixed = c.post("/v1/plans", json=spec).json()
        assert mixed.get("runtime") == "working_set", mixed
        assert mixed["working_set"]["optimizer"] == "host"
        assert mixed["predicted"]["peak_host_bytes"] > pure["predicted"]["peak_host_bytes"]
        spec["overrides"] = {"runtime": "working_set", "optimizer": "device"}
        r = c.post("/v1/plans", json=spec)
        assert r.status_code == 422 and "fp32 master on the host" in r.text


def test_seq_len_past_the_models_positions_plans_with_a_warning(api_only: Stack) -> None:
    """micro-llama has 512 positions; RoPE has no table to outgrow, so 4096 is planned and
    the plan says why it may hurt a pretrained model."""
    with api_only.client() as c:
        r = c.post("/v1/plans", json=tiny_spec("long", seq_len=4096))
        assert r.status_code == 200, r.text
        assert "max_position_embeddings" in r.json()["reasons"]["seq_len"]
        assert "seq_len" not in c.post("/v1/plans", json=tiny_spec("short")).json()["reasons"]


def test_grad_clip_zero_or_null_turns_clipping_off() -> None:
    for off in (0, 0.0, None):
        assert OptimizerSpec(grad_clip=off).grad_clip is None
    assert OptimizerSpec().grad_clip == 1.0
    with pytest.raises(ValueError, match="grad_clip"):
        OptimizerSpec(grad_clip=-1)
