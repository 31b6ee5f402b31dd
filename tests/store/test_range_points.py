"""A ranged job in the queue, on a real Redis through a real API: the store keeps its
plannable points, min first, and the scheduling policy reads it at its min (all it is
promised), whatever point it last ran at (store/scheduling.py)."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import Stack, tiny_spec
from wstrain.contracts.calibration import GIB
from wstrain.store import JobStore
from wstrain.store.scheduling import SchedulingView

pytestmark = pytest.mark.usefixtures("leave_the_queue_as_found")

RANGED = {"device_gib": {"min": 1, "max": 40}, "host_gib": 2}


def test_a_queued_ranged_job_is_read_at_its_min_with_its_points(
    api_only: Stack, redis_url: str
) -> None:
    with api_only.client() as c:
        r = c.post("/v1/jobs", json=tiny_spec("ranged-queued", budget=RANGED))
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        fixed = c.post("/v1/jobs", json=tiny_spec("fixed-queued"))
        assert fixed.status_code == 201, fixed.text

    async def rows() -> dict[str, object]:
        store = JobStore.from_url(redis_url, "apionly")
        try:
            return {row.id: row for row in await SchedulingView(store).pending(500)}
        finally:
            await store.close()

    got = asyncio.run(rows())
    row, plain = got[job_id], got[fixed.json()["id"]]
    points = row.points  # type: ignore[attr-defined]
    assert len(points) >= 2 and points[0].device_bytes == 1 * GIB
    assert [p.device_bytes for p in points] == sorted(p.device_bytes for p in points)
    assert all(p.host_bytes == 2 * GIB and p.tokens_per_s > 0 for p in points)
    # stored at its chosen point (the largest the node holds), queued at its min
    assert row.device_bytes > GIB  # type: ignore[attr-defined]
    pending = row.pending()  # type: ignore[attr-defined]
    assert (pending.device_bytes, pending.host_bytes) == (GIB, 2 * GIB)
    assert pending.points == points
    assert plain.points == () and plain.pending().points == ()  # type: ignore[attr-defined]
