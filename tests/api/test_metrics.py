"""The API's /metrics against real uvicorn replicas on one real Redis: one replica exports
the store-wide series (no job counted twice), the method label is bounded, and /metrics
still answers (redis_up 0) while Redis is down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Stack, make_stack, register_node, tiny_spec


@pytest.fixture(scope="module")
def replicas(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Stack]]:
    tmp = tmp_path_factory.mktemp("replicas")
    stacks = [make_stack(redis_url, tmp / str(i), "replicas", with_agent=False) for i in (0, 1)]
    register_node(redis_url, "replicas")
    yield stacks
    for s in stacks:
        s.stop()


def _value(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def test_one_replica_exports_the_store(replicas: list[Stack]) -> None:
    with replicas[0].client() as c:
        job = c.post("/v1/jobs", json=tiny_spec("counted-once")).json()["id"]
    for _ in range(3):  # the lease holder stays the holder scrape after scrape
        texts = [httpx.get(f"{s.url}/metrics", timeout=10).text for s in replicas]
        leaders = [_value(t, "wstrain_exporter_leader") for t in texts]
        assert sorted(leaders) == [0.0, 1.0], leaders  # type: ignore[type-var]
        lead, other = (texts[0], texts[1]) if leaders[0] == 1.0 else (texts[1], texts[0])
        info = [ln for ln in lead.splitlines() if ln.startswith("wstrain_job_info{")]
        assert any(f'job="{job}"' in ln for ln in info) and f'job="{job}"' not in other
        assert _value(lead, "wstrain_queue_depth") is not None
        assert _value(other, "wstrain_queue_depth") is None
        assert _value(lead, "wstrain_redis_up") == 1.0 == _value(other, "wstrain_redis_up")


def test_an_unknown_method_is_labelled_other(replicas: list[Stack]) -> None:
    s = replicas[0]
    for method in ("BREW", "PROPFIND", "X" * 200):
        httpx.request(method, f"{s.url}/v1/jobs", timeout=10)
    text = httpx.get(f"{s.url}/metrics", timeout=10).text
    methods = {
        line.split('method="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("wstrain_api_request_duration_seconds_count")
    }
    assert "other" in methods and methods <= {"GET", "POST", "other"}, methods


def test_metrics_answer_while_redis_is_down(tmp_path: Path) -> None:
    from tests.ports import free_port
    from wstrain.cli.serve import start_redis

    port = free_port()
    redis = start_redis(tmp_path / "redis", port)
    stack = make_stack(f"redis://127.0.0.1:{port}/0", tmp_path, "down", with_agent=False)
    try:
        assert _value(httpx.get(f"{stack.url}/metrics").text, "wstrain_redis_up") == 1.0
        redis.terminate()
        redis.wait(10)
        r = httpx.get(f"{stack.url}/metrics", timeout=30)
        assert r.status_code == 200
        assert _value(r.text, "wstrain_redis_up") == 0.0
        assert _value(r.text, "wstrain_exporter_leader") == 0.0
        assert "wstrain_api_request_duration_seconds_count" in r.text
    finally:
        stack.stop()
        if redis.poll() is None:
            redis.terminate()
