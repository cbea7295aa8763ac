"""A Citus worker stopped mid-stream, and started again: the service on a cluster of its own (a coordinator
and two workers; stopping a node must not disturb the other modules' cluster), through the real API and
a real worker (offline writer).

Tenants on both workers post a chunk each, round after round, as their users move from city to city,
while the worker applies them. One worker is stopped in the middle of it. The tenants whose shards are
on it wait: each request answers 503 `unavailable` with `Retry-After`, at once (no 500, no hang), and
their chunks acknowledged before the stop stay queued, none failed, none lost. The other worker's
tenants go on: their chunks are acknowledged, applied and found by search while the node is down. When
it is back, every acknowledged chunk is applied exactly once, in order per user: one writer changeset
and one `chunk.applied` event per chunk, applied in `seq` order, and the user's memory is the city of
their last acknowledged chunk."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.engine import create_engine, create_sessionmaker
from app.domain.accounts.services import create_tenant
from app.lib.embedded import EmbeddedCitusNode
from app.server.asgi import create_app
from tests.citus.conftest import service_settings, started_cluster
from tests.support.waiting import wait_for
from tests.support.workers import chunk_counts, running_worker, wait_for_chunks

# Consecutive rounds name different cities, so each chunk changes where the user lives.
CITIES = [
    "Oslo",
    "Lyon",
    "Kyoto",
    "Quito",
    "Perth",
    "Cairo",
    "Dakar",
    "Hanoi",
    "Lima",
    "Riga",
    "Bern",
    "Pune",
]
# Every request is answered within this, during the outage too (a hang fails the test).
ANSWER_WITHIN_S = 10.0
# A chat app's pace between rounds: time that must pass, or the posts would only measure the loop.
ROUND_PAUSE_S = 0.2


@dataclass
class Tenant:
    id: uuid.UUID
    headers: dict[str, str]
    down: bool  # its shards are on the worker that is stopped
    acked: list[tuple[int, uuid.UUID, str]] = field(default_factory=list)  # (seq, chunk id, city)
    refused: int = 0  # 503 answers


@dataclass
class Rig:
    settings: Settings
    coordinator: EmbeddedCitusNode
    workers: list[EmbeddedCitusNode]


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    """A cluster of this module's own, migrated and distributed as `memstore up --citus-workers 2` does."""
    with started_cluster("memstore-citus-down-") as cluster:
        settings = service_settings(
            cluster.service_url, cluster.owner_url, cluster.redis_url, log_format="json"
        )
        yield Rig(settings, cluster.coordinator, cluster.workers)


async def _tenants(rig: Rig, sessionmaker: async_sessionmaker[AsyncSession], stopped: str) -> list[Tenant]:
    """At least three tenants on each worker (tenants are placed by the hash of their id)."""
    coordinator = await asyncpg.connect(
        host=str(rig.coordinator.socket_dir), user="postgres", database=rig.coordinator.database
    )
    tenants: list[Tenant] = []
    try:
        while min(sum(t.down for t in tenants), sum(not t.down for t in tenants)) < 3:
            assert len(tenants) < 30, "tenants keep landing on one worker"
            async with sessionmaker() as session, session.begin():
                tenant, key = await create_tenant(session, f"down-{len(tenants):02d}-{uuid.uuid4().hex[:6]}")
            node = await coordinator.fetchval(
                "SELECT nodename FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)"
                " WHERE p.shardid = get_shard_id_for_distribution_column('chunks', $1::uuid)",
                tenant.id,
            )
            tenants.append(Tenant(tenant.id, {"Authorization": f"Bearer {key}"}, node == stopped))
    finally:
        await coordinator.close()
    return tenants


@dataclass
class Stream:
    """Rounds of one chunk per tenant, posted together, each answer timed."""

    api: AsyncTestClient[Litestar]
    tenants: list[Tenant]
    rounds: int = 0
    slowest_s: float = 0.0
    answers: list[tuple[bool, int, float, float]] = field(default_factory=list)  # (down, status, at, took)

    async def post_round(self) -> None:
        self.rounds += 1
        city = CITIES[self.rounds % len(CITIES)]
        await asyncio.gather(*(self._post(t, city) for t in self.tenants))

    async def _post(self, t: Tenant, city: str) -> None:
        body = {"user_id": "ada", "messages": [{"role": "user", "content": f"I moved to {city}."}]}
        started = time.monotonic()
        response = await asyncio.wait_for(
            self.api.post("/v1/chunks", json=body, headers=t.headers), ANSWER_WITHIN_S
        )
        took = time.monotonic() - started
        self.slowest_s = max(self.slowest_s, took)
        self.answers.append((t.down, response.status_code, started, took))
        if response.status_code == 202:
            found = response.json()
            t.acked.append((found["seq"], uuid.UUID(found["chunk_id"]), city))
            return
        assert response.status_code == 503, response.text  # never a 500, nor a chunk lost silently
        assert response.json()["error"]["code"] == "unavailable", response.text
        assert response.headers.get("retry-after"), response.headers
        t.refused += 1

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.post_round()
            await asyncio.sleep(ROUND_PAUSE_S)


async def _applied_since(
    sessionmaker: async_sessionmaker[AsyncSession],
    t: Tenant,
    since: datetime,
    *,
    received_before: bool = False,
) -> int:
    """The tenant's chunks applied after `since` (with `received_before`: of those received before it)."""
    received = " AND received_at < :s" if received_before else ""
    async with sessionmaker() as session:
        count = await session.scalar(
            text(
                "SELECT count(*) FROM chunks WHERE tenant_id = :t AND status = 'applied' AND applied_at > :s"
                + received
            ),
            {"t": t.id, "s": since},
        )
    return int(count or 0)


async def _search(api: AsyncTestClient[Litestar], t: Tenant) -> tuple[int, Any]:
    response = await asyncio.wait_for(
        api.post(
            "/v1/memories/search",
            json={"user_id": "ada", "query": "where does the user live"},
            headers=t.headers,
        ),
        ANSWER_WITHIN_S,
    )
    return response.status_code, response.json()


async def test_a_worker_stopped_mid_stream_holds_its_tenants_chunks_and_not_the_others(rig: Rig) -> None:
    stopped = rig.workers[0]
    engine = create_engine(rig.settings.as_owner(), application_name="memstore-tests")
    sessionmaker = create_sessionmaker(engine)
    tenants = await _tenants(rig, sessionmaker, str(stopped.socket_dir))
    down = [t for t in tenants if t.down]
    up = [t for t in tenants if not t.down]
    async with AsyncTestClient(create_app(rig.settings, configure_logs=False)) as api:
        stream = Stream(api, tenants)
        async with running_worker(rig.settings):
            # Both workers up: two rounds applied, and found.
            for _ in range(2):
                await stream.post_round()
            for t in tenants:
                assert await wait_for_chunks(sessionmaker, t.id, len(t.acked)) == {"applied": len(t.acked)}
                status, found = await _search(api, t)
                assert status == 200, found

            stop = asyncio.Event()
            posting = asyncio.create_task(stream.run(stop))
            restarted: float | None = None
            try:
                # Mid-stream: rounds are posted and applied while the node goes down.
                await wait_for(lambda: stream.rounds >= 4, timeout_s=30, what="rounds posted")
                await asyncio.to_thread(stopped.stop)
                stopped_at = time.monotonic()
                async with sessionmaker() as session:
                    down_since = await session.scalar(text("SELECT now()"))
                answers_from = len(stream.answers)

                # The other worker's tenants go on: chunks acknowledged and applied while the node is down.
                async def progress() -> dict[str, int]:
                    return {
                        "up tenants with chunks applied since the stop": sum(
                            [await _applied_since(sessionmaker, t, down_since) >= 3 for t in up]
                        ),
                        "down tenants refused at least 3 times": sum(t.refused >= 3 for t in down),
                    }

                await wait_for(
                    progress,
                    lambda seen: (
                        seen
                        == {
                            "up tenants with chunks applied since the stop": len(up),
                            "down tenants refused at least 3 times": len(down),
                        }
                    ),
                    timeout_s=60,
                    what="the live worker's tenants applied, the stopped one's refused",
                    interval_s=0.2,
                )
                for t in up:  # ... and searched
                    status, found = await _search(api, t)
                    assert status == 200, found
                    assert found["results"], found
                for t in down:
                    status, found = await _search(api, t)
                    assert (status, found["error"]["code"]) == (503, "unavailable"), found
                outage = [a for a in stream.answers[answers_from:] if a[2] >= stopped_at]
                outage_s = time.monotonic() - stopped_at
                acked_before = {t.id: len(t.acked) for t in down}

                await asyncio.to_thread(stopped.start)
                restarted = time.monotonic()
                # The stopped node's tenants are acknowledged again.
                await wait_for(
                    lambda: all(len(t.acked) > acked_before[t.id] for t in down),
                    timeout_s=60,
                    what="the restarted worker's tenants acknowledged again",
                    interval_s=0.1,
                )
            finally:
                stop.set()
                await posting
                if restarted is None:  # started again, whatever happened above
                    with contextlib.suppress(Exception):
                        await asyncio.to_thread(stopped.start)

            # Every acknowledged chunk applied, none failed.
            for t in tenants:
                counts = await wait_for_chunks(sessionmaker, t.id, len(t.acked), timeout_s=90)
                assert counts == {"applied": len(t.acked)}, (t.down, counts)
            drained_s = time.monotonic() - restarted
            # Acknowledged before the stop, applied only after it: held while the node was down.
            held = sum(
                [await _applied_since(sessionmaker, t, down_since, received_before=True) for t in down]
            )

        for t in tenants:
            await _check_applied_once_in_order(api, sessionmaker, t)

    refused = [a for a in outage if a[1] == 503]
    print(
        f"\nworker down {outage_s:.1f} s: {len(outage)} posts, {len(refused)} answered 503 "
        f"(all from its {len(down)} tenants), the slowest answer {max(a[3] for a in outage):.3f} s; "
        f"{sum(a[1] == 202 for a in outage)} acknowledged for the other {len(up)} tenants; "
        f"{held} chunks of the stopped node's tenants held until it was back; all "
        f"{sum(len(t.acked) for t in tenants)} chunks applied {drained_s:.1f} s after the restart"
    )
    assert {a[0] for a in refused} == {True}  # only the stopped node's tenants were refused
    assert not [a for a in outage if a[0] and a[1] == 202]  # and none of theirs acknowledged meanwhile
    assert stream.slowest_s < ANSWER_WITHIN_S
    await engine.dispose()


async def _check_applied_once_in_order(
    api: AsyncTestClient[Litestar], sessionmaker: async_sessionmaker[AsyncSession], t: Tenant
) -> None:
    """Exactly the acknowledged chunks, each applied once, in `seq` order; the user lives in the city of
    their last one."""
    async with sessionmaker() as session:
        chunks = (
            await session.execute(
                text(
                    "SELECT c.id, c.seq, c.status, c.applied_at,"
                    " (SELECT count(*) FROM changesets s WHERE s.tenant_id = c.tenant_id"
                    "  AND s.chunk_id = c.id AND s.kind = 'writer') AS changesets,"
                    " (SELECT count(*) FROM audit_events e WHERE e.tenant_id = c.tenant_id"
                    "  AND e.action = 'chunk.applied' AND e.target_id = c.id::text) AS events"
                    " FROM chunks c WHERE c.tenant_id = :t ORDER BY c.seq"
                ),
                {"t": t.id},
            )
        ).all()
    assert [(c.seq, c.id) for c in chunks] == [(seq, chunk_id) for seq, chunk_id, _ in sorted(t.acked)]
    assert {(c.status, c.changesets, c.events) for c in chunks} == {("applied", 1, 1)}, chunks
    applied_at = [c.applied_at for c in chunks]
    assert applied_at == sorted(applied_at), chunks
    assert len(set(applied_at)) == len(applied_at), chunks  # one after the other, never together
    listing = await api.get("/v1/memories", params={"user_id": "ada"}, headers=t.headers)
    assert listing.status_code == 200, listing.text
    last_city = sorted(t.acked)[-1][2]
    assert [m["content"] for m in listing.json()["items"]] == [f"The user lives in {last_city}."]
    assert await chunk_counts(sessionmaker, t.id) == {"applied": len(t.acked)}
