"""The ingest batcher's walls between requests: a value Postgres refuses fails only its own request,
a request that loses an idempotency race writes none of its chunks, and waiting chunks are bounded."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.db.models import Chunk
from app.domain.accounts.services import Principal
from app.domain.ingest.batcher import IngestBatcher
from app.domain.ingest.schemas import ChunkIn, MessageIn
from app.domain.ingest.services import Accepted, body_hash
from app.lib.errors import ApiError, ConflictError
from app.lib.queue import JobQueue, create_redis
from tests.conftest import TenantKeys
from tests.support.waiting import wait_for


def a_chunk(user_id: str, content: str = "I live in Lyon.") -> ChunkIn:
    return ChunkIn(user_id=user_id, messages=[MessageIn(role="user", content=content)])


@pytest.fixture
def principal(tenant: TenantKeys) -> Principal:
    return Principal(
        key_id=uuid.uuid4(), tenant_id=tenant.tenant_id, name="test", roles=frozenset({"ingest"})
    )


@pytest.fixture
async def batcher(
    sessionmaker: async_sessionmaker[AsyncSession], redis_url: str
) -> AsyncIterator[IngestBatcher]:
    queue = JobQueue(create_redis(redis_url))
    batcher = IngestBatcher(sessionmaker, queue, writers=1, max_pending=50)
    yield batcher
    await batcher.close()
    await queue.close()


async def stored(sessionmaker: async_sessionmaker[AsyncSession]) -> dict[str, int]:
    async with sessionmaker() as session:
        rows = await session.execute(select(Chunk.user_id, func.count()).group_by(Chunk.user_id))
        return {user: int(n) for user, n in rows.all()}


async def test_a_value_postgres_refuses_fails_only_its_own_request(
    batcher: IngestBatcher, principal: Principal, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    # Past the HTTP edge (which refuses a NUL with a 422) this is the second wall: the bad chunk shares
    # a transaction with the others, and only it may fail.
    requests = [[(a_chunk(f"u-{i}"), None)] for i in range(12)]
    requests[5] = [(a_chunk("u-bad", "x\x00y"), None)]
    results = await asyncio.gather(
        *(batcher.submit(principal, chunks, None) for chunks in requests), return_exceptions=True
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(failed) == 1
    assert isinstance(results[5], ApiError)
    assert results[5].status_code == 422
    assert all(isinstance(r, list) and isinstance(r[0], Accepted) for i, r in enumerate(results) if i != 5)
    assert await stored(sessionmaker) == {f"u-{i}": 1 for i in range(12) if i != 5}


async def test_a_request_that_loses_an_idempotency_race_writes_none_of_its_chunks(
    batcher: IngestBatcher,
    principal: Principal,
    engine: AsyncEngine,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    theirs = a_chunk("u-1", "I live in Paris.")
    # Another API process has inserted a chunk under key K and not yet committed: our batch does not
    # see it when it looks the key up, and its insert waits on the unique index until that commit.
    other = await engine.connect()
    transaction = await other.begin()
    await other.execute(
        text(
            "INSERT INTO chunks (id, tenant_id, user_id, seq, messages, idempotency_key, body_hash) "
            "VALUES (:id, :tenant, 'u-1', 1000, '[]', 'K', :hash)"
        ),
        {"id": uuid.uuid4(), "tenant": principal.tenant_id, "hash": body_hash(theirs)},
    )
    ours = [(a_chunk("u-2", "I like jazz."), None), (a_chunk("u-1", "I live in Rome."), "K")]
    submitted = asyncio.create_task(batcher.submit(principal, ours, None))

    async def insert_is_waiting() -> bool:
        async with sessionmaker() as session:
            waiting = await session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO chunks%'"
                )
            )
        return bool(waiting)

    await wait_for(insert_is_waiting, timeout_s=10, what="the batch waiting on the other process's key")
    await transaction.commit()
    await other.close()

    with pytest.raises(ConflictError):
        await submitted
    # The request is atomic: its first chunk, written in the same transaction, is gone too.
    assert await stored(sessionmaker) == {"u-1": 1}
    # And the batcher goes on serving.
    [accepted] = await batcher.submit(principal, [(a_chunk("u-2"), None)], None)
    assert accepted.seq == 1


async def test_waiting_chunks_are_bounded_with_a_503(
    batcher: IngestBatcher, principal: Principal, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    # All requests arrive in one turn of the event loop, before the writer takes any (bound: 50).
    requests = [[(a_chunk(f"u-{i}"), None) for _ in range(20)] for i in range(4)]
    results = await asyncio.gather(
        *(batcher.submit(principal, chunks, None) for chunks in requests), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, ApiError)]
    assert [r.status_code for r in refused] == [503, 503]
    assert all(r.headers and r.headers.get("Retry-After") for r in refused)
    assert await stored(sessionmaker) == {"u-0": 20, "u-1": 20}
    # Once the lane has drained, requests are taken again.
    assert len(await batcher.submit(principal, requests[2], None)) == 20
