"""Ingestion: validated, durable before 202, numbered per scope, idempotent, isolated per tenant."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import AuditEvent, Chunk
from app.domain.pipeline.scheduler import queues
from app.lib.queue import create_redis
from app.server.asgi import create_app
from tests.conftest import TenantKeys, bearer
from tests.support.waiting import wait_for

Client = AsyncTestClient[Litestar]


def chunk(
    user_id: str = "u-1", text_: str = "I moved to Seattle last month.", **extra: Any
) -> dict[str, Any]:
    return {
        "user_id": user_id,
        "messages": [
            {"role": "user", "content": text_, "name": "Ana", "created_at": "2026-11-30T10:00:00Z"},
            {"role": "assistant", "content": "Noted — Seattle it is."},
        ],
        **extra,
    }


async def ingest_key(client: Client, tenant: TenantKeys, roles: list[str] | None = None) -> dict[str, str]:
    response = await client.post(
        "/v1/admin/keys", json={"name": "chat", "roles": roles or ["ingest"]}, headers=tenant.admin
    )
    return bearer(response.json()["key"])


async def count(sessionmaker: async_sessionmaker[AsyncSession], model: Any = Chunk) -> int:
    async with sessionmaker() as session:
        return int(await session.scalar(select(func.count()).select_from(model)) or 0)


async def scopes_ready(redis_url: str) -> int:
    client = create_redis(redis_url)
    try:
        return sum(q.ready for q in await queues(client))
    finally:
        await client.aclose()


async def test_accepted_chunk_is_durable_and_numbered(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession], redis_url: str
) -> None:
    headers = await ingest_key(client, tenant)
    first = await client.post(
        "/v1/chunks", json=chunk(metadata={"channel": "web"}, agent_id="bot"), headers=headers
    )
    assert first.status_code == 202, first.text
    body = first.json()
    assert body["status"] == "queued"
    assert body["seq"] == 1
    second = await client.post("/v1/chunks", json=chunk(), headers=headers)
    other_user = await client.post("/v1/chunks", json=chunk(user_id="u-2"), headers=headers)
    assert second.json()["seq"] == 2
    assert other_user.json()["seq"] == 1

    async with sessionmaker() as session:
        stored = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(body["chunk_id"])))
        assert stored is not None
        assert stored.tenant_id == tenant.tenant_id
        assert stored.messages[0]["content"] == "I moved to Seattle last month."
        assert stored.metadata_ == {"channel": "web"}
        assert stored.agent_id == "bot"
        actions = (await session.scalars(select(AuditEvent.action))).all()
    assert actions.count("chunk.accepted") == 3
    # Each scope made ready once in the fair scheduler, after the commit: u-1's two chunks share one.
    assert await wait_for(lambda: scopes_ready(redis_url), lambda n: n >= 2, timeout_s=5, what="ready") == 2

    status = await client.get(f"/v1/chunks/{body['chunk_id']}", headers=headers)
    assert status.status_code == 200
    assert status.json()["status"] == "queued"
    assert status.json()["seq"] == 1
    assert status.json()["user_id"] == "u-1"


async def test_concurrent_chunks_of_one_user_get_distinct_consecutive_seqs(
    client: Client, tenant: TenantKeys
) -> None:
    headers = await ingest_key(client, tenant)
    responses = await asyncio.gather(
        *(
            client.post("/v1/chunks", json=chunk(text_=f"I like item {i}."), headers=headers)
            for i in range(30)
        )
    )
    assert {r.status_code for r in responses} == {202}
    assert sorted(r.json()["seq"] for r in responses) == list(range(1, 31))


async def test_idempotency_key_replays_and_conflicts(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    headers = await ingest_key(client, tenant)
    keyed = {**headers, "Idempotency-Key": "msg-42"}
    first = await client.post("/v1/chunks", json=chunk(), headers=keyed)
    again = await client.post("/v1/chunks", json=chunk(), headers=keyed)
    assert first.status_code == 202
    assert again.status_code == 200
    assert again.json()["chunk_id"] == first.json()["chunk_id"]
    # Same content with keys in another order and other whitespace is the same body.
    reordered = json.dumps(dict(reversed(list(chunk().items()))), indent=2)
    same = await client.post(
        "/v1/chunks", content=reordered, headers={**keyed, "Content-Type": "application/json"}
    )
    assert same.json()["chunk_id"] == first.json()["chunk_id"]

    conflict = await client.post("/v1/chunks", json=chunk(text_="I live in Oslo."), headers=keyed)
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "idempotency_conflict"
    assert await count(sessionmaker) == 1


async def test_concurrent_requests_with_one_idempotency_key_make_one_chunk(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    headers = {**(await ingest_key(client, tenant)), "Idempotency-Key": "same"}
    responses = await asyncio.gather(
        *(client.post("/v1/chunks", json=chunk(), headers=headers) for _ in range(10))
    )
    assert {r.status_code for r in responses} <= {200, 202}
    assert len({r.json()["chunk_id"] for r in responses}) == 1
    assert await count(sessionmaker) == 1


async def test_batch_is_in_order_and_atomic(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    headers = await ingest_key(client, tenant)
    batch = {
        "chunks": [chunk(text_="I live in Lyon."), chunk(user_id="u-2"), chunk(text_="I moved to Nice.")]
    }
    response = await client.post("/v1/chunks/batch", json=batch, headers=headers)
    assert response.status_code == 202, response.text
    results = response.json()["results"]
    assert [r["seq"] for r in results] == [1, 1, 2]
    # One bad chunk rejects the whole batch, and nothing of it is stored.
    bad = {"chunks": [chunk(text_="I live in Oslo."), {"user_id": "u-3", "messages": []}]}
    response = await client.post("/v1/chunks/batch", json=bad, headers=headers)
    assert response.status_code == 422
    assert await count(sessionmaker) == 3


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b'{"user_id": "u-1", "messages": [', 400, "invalid_json"),
        (b"not json at all", 400, "invalid_json"),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', 422, "validation_error"),
        (b'{"user_id": "u-1", "messages": []}', 422, "validation_error"),
        (b'{"user_id": "", "messages": [{"role": "user", "content": "hi"}]}', 422, "validation_error"),
        (b'{"user_id": "u-1", "messages": [{"role": "robot", "content": "hi"}]}', 422, "validation_error"),
        (b'{"user_id": "u-1", "messages": [{"role": "user", "content": ""}]}', 422, "validation_error"),
        (
            b'{"user_id": "u-1", "messages": '
            b'[{"role": "user", "content": "hi", "created_at": "2026-11-30T10:00:00"}]}',
            422,
            "validation_error",
        ),  # a time without a zone
        (
            b'{"user_id": "u-1", "messages": [{"role": "user", "content": "hi"}], "surprise": 1}',
            422,
            "validation_error",
        ),
        (
            b'{"user_id": "u-1", "messages": [{"role": "user", "content": "hi"}], "writer": "nope"}',
            422,
            "validation_error",
        ),
    ],
)
async def test_bad_input_is_rejected_and_changes_nothing(
    client: Client,
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
    redis_url: str,
    body: bytes,
    status: int,
    code: str,
) -> None:
    headers = {**(await ingest_key(client, tenant)), "Content-Type": "application/json"}
    response = await client.post("/v1/chunks", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert await count(sessionmaker) == 0
    assert await scopes_ready(redis_url) == 0


async def test_limits_are_enforced(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession], redis_url: str
) -> None:
    small = settings.model_copy(
        update={"max_body_bytes": 2000, "max_messages_per_chunk": 3, "max_message_chars": 50}
    )
    async with AsyncTestClient(create_app(small, configure_logs=False)) as client:
        headers = await ingest_key(client, tenant)
        too_big = chunk(text_="x" * 3000)
        response = await client.post("/v1/chunks", json=too_big, headers=headers)
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "payload_too_large"
        many = {"user_id": "u", "messages": [{"role": "user", "content": "hi"}] * 4}
        response = await client.post("/v1/chunks", json=many, headers=headers)
        assert response.status_code == 422
        assert response.json()["error"]["details"]["field"] == "messages"
        long = chunk(text_="y" * 51)
        response = await client.post("/v1/chunks", json=long, headers=headers)
        assert response.status_code == 422
        assert response.json()["error"]["details"]["field"] == "messages[0].content"
    assert await count(sessionmaker) == 0
    assert await scopes_ready(redis_url) == 0


async def test_roles_and_tenants(client: Client, tenant: TenantKeys, other_tenant: TenantKeys) -> None:
    reader = await ingest_key(client, tenant, ["read"])
    response = await client.post("/v1/chunks", json=chunk(), headers=reader)
    assert response.status_code == 403
    ingest = await ingest_key(client, tenant)
    accepted = (await client.post("/v1/chunks", json=chunk(), headers=ingest)).json()
    # A reader of the same tenant may see it; another tenant may not even learn it exists.
    assert (await client.get(f"/v1/chunks/{accepted['chunk_id']}", headers=reader)).status_code == 200
    theirs = await ingest_key(client, other_tenant, ["ingest", "read"])
    response = await client.get(f"/v1/chunks/{accepted['chunk_id']}", headers=theirs)
    assert response.status_code == 404
    # Scopes are per tenant: the same user_id elsewhere starts again at seq 1.
    assert (await client.post("/v1/chunks", json=chunk(), headers=theirs)).json()["seq"] == 1


async def test_ingestion_keeps_accepting_while_redis_is_down(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Any
) -> None:
    nowhere = settings.model_copy(update={"redis_url": f"unix://{tmp_path}/no-redis.sock"})
    async with AsyncTestClient(create_app(nowhere, configure_logs=False)) as client:
        headers = await ingest_key(client, tenant)
        responses = [
            await client.post("/v1/chunks", json=chunk(text_=f"I like tea {i}."), headers=headers)
            for i in range(5)
        ]
    assert {r.status_code for r in responses} == {202}
    assert await count(sessionmaker) == 5


async def test_a_key_repeated_inside_one_batch(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    headers = await ingest_key(client, tenant)
    same = {"chunks": [chunk(idempotency_key="k-1"), chunk(idempotency_key="k-1")]}
    response = await client.post("/v1/chunks/batch", json=same, headers=headers)
    assert response.status_code == 202, response.text
    first, second = response.json()["results"]
    assert first["chunk_id"] == second["chunk_id"]
    assert first["seq"] == second["seq"] == 1
    # The key sent as a header for the same content is the same request, not a conflict.
    again = await client.post("/v1/chunks", json=chunk(), headers={**headers, "Idempotency-Key": "k-1"})
    assert again.status_code == 200
    assert again.json()["chunk_id"] == first["chunk_id"]
    differ = {"chunks": [chunk(idempotency_key="k-2"), chunk(text_="I live in Oslo.", idempotency_key="k-2")]}
    response = await client.post("/v1/chunks/batch", json=differ, headers=headers)
    assert response.status_code == 409
    assert await count(sessionmaker) == 1
