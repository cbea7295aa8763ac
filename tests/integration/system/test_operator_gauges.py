"""`/metrics` serves the gauges the operator's alerts read: the review queue, the audit sealer's lag and
the workers alive, each as the database and Redis have it at the scrape."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import AuditEvent, Review
from app.domain.system.services import HEARTBEAT_TTL_S, WorkerBeat, beat
from app.lib.queue import create_redis
from tests.conftest import TenantKeys
from tests.integration.system.test_metrics import sample
from tests.support.workers import running_worker, wait_until

GAUGES = (
    "memstore_reviews_waiting",
    "memstore_review_oldest_age_seconds",
    "memstore_audit_unsealed_age_seconds",
    "memstore_workers_alive",
)


def held(tenant_id: uuid.UUID, age_s: float, status: str = "pending") -> Review:
    """A writer's DELETE held for review `age_s` seconds ago."""
    return Review(
        tenant_id=tenant_id,
        user_id="ana",
        changeset_id=uuid.uuid4(),
        op_index=0,
        op={"op": "DELETE", "content": None, "tags": [], "owner": None, "reason": "asked to"},
        targets=[{"memory_id": str(uuid.uuid4()), "version": 1}],
        status=status,
        created_at=datetime.now(UTC) - timedelta(seconds=age_s),
    )


async def gauges(client: AsyncTestClient[Litestar]) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    for name in GAUGES:
        assert f"# TYPE {name} gauge" in text, f"/metrics does not serve {name}"
    return {name: sample(text, name) for name in GAUGES}


async def test_the_operator_gauges_follow_reviews_the_sealer_and_the_workers(
    client: AsyncTestClient[Litestar],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    before = await gauges(client)
    assert before["memstore_reviews_waiting"] == 0
    assert before["memstore_review_oldest_age_seconds"] == 0
    assert before["memstore_workers_alive"] == 0

    async with sessionmaker() as session, session.begin():
        session.add_all(
            [
                held(tenant.tenant_id, 120),
                held(tenant.tenant_id, 1),
                held(tenant.tenant_id, 900, status="approved"),  # decided: not waiting
                held(other_tenant.tenant_id, 5),
            ]
        )
        session.add(
            AuditEvent(
                tenant_id=other_tenant.tenant_id,
                actor="test",
                action="key.created",
                created_at=datetime.now(UTC) - timedelta(seconds=300),
            )
        )
    now = await gauges(client)
    assert now["memstore_reviews_waiting"] == 3, "every tenant's pending reviews, none decided"
    assert 120 <= now["memstore_review_oldest_age_seconds"] < 900
    assert now["memstore_audit_unsealed_age_seconds"] >= 300

    # A worker that died without a word: its last beat is older than the TTL, so it is not counted.
    redis = create_redis(str(settings.redis_url))
    try:
        long_ago = time.time() - HEARTBEAT_TTL_S - 1
        await beat(redis, WorkerBeat("gone:1", "gone", 1, 4, {}, long_ago - 60, long_ago))
    finally:
        await redis.aclose()
    assert (await gauges(client))["memstore_workers_alive"] == 0

    async with running_worker(settings):

        async def alive_and_sealed() -> bool:
            found = await gauges(client)
            return found["memstore_workers_alive"] == 1 and found["memstore_audit_unsealed_age_seconds"] == 0

        # The worker's sealer (every 2 s, and at start) seals every tenant's events into its chain.
        await wait_until(alive_and_sealed, 30, "one worker alive and every audit event sealed")
    after = await gauges(client)
    assert after["memstore_workers_alive"] == 0, "a worker that stopped is no longer counted"
    assert after["memstore_reviews_waiting"] == 3
