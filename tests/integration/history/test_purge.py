"""The GDPR purge: a user's content removed everywhere, leaving a content-free audit event."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.domain.audit.services import Actor
from app.domain.history import services as history
from app.domain.ingest.repositories import ScopeRepository
from app.domain.pipeline.repositories import PipelineRepository
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.integration.audit.test_audit_log import _events, _verify
from tests.support.history import memory, write
from tests.support.waiting import wait_for

Client = AsyncTestClient[Litestar]


SECRET = "Zanzibar-7731"

CONTENT_TABLES = ("chunks", "memories", "memory_versions", "changesets", "reviews", "audit_events")


async def _mentions(sessionmaker: async_sessionmaker[AsyncSession], needle: str) -> dict[str, int]:
    async with sessionmaker() as session:
        return {
            table: int(
                await session.scalar(
                    text(f"SELECT count(*) FROM {table} t WHERE t::text LIKE :n"), {"n": f"%{needle}%"}
                )
                or 0
            )
            for table in CONTENT_TABLES
        }


async def test_purge_removes_the_users_content_everywhere(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    for user in ("victim", "keeper"):
        body = {"user_id": user, "messages": [{"role": "user", "content": f"My code is {SECRET}-{user}."}]}
        assert (await client.post("/v1/chunks", json=body, headers=tenant.admin)).status_code == 202
        await write(
            sessionmaker, tenant.tenant_id, user, [Op(OpKind.ADD, f"The user's code is {SECRET}-{user}.")]
        )
    victim = await memory(sessionmaker, f"The user's code is {SECRET}-victim.")
    edited = await client.patch(
        f"/v1/memories/{victim.id}", json={"content": f"Code {SECRET}-victim!"}, headers=tenant.admin
    )
    assert edited.status_code == 200
    rolled = await client.post(
        f"/v1/admin/memories/{victim.id}/rollback", json={"to_version": 1}, headers=tenant.admin
    )
    assert rolled.status_code == 200
    assert (await _mentions(sessionmaker, f"{SECRET}-victim"))["memory_versions"] == 3

    refused = await client.delete("/v1/admin/users/victim", headers=tenant.admin)
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "purge_not_confirmed")
    dry = await client.delete(
        "/v1/admin/users/victim", params={"purge": "true", "dry_run": "true"}, headers=tenant.admin
    )
    assert dry.status_code == 200, dry.text
    assert (await _mentions(sessionmaker, f"{SECRET}-victim"))["memory_versions"] == 3
    purged = await client.delete("/v1/admin/users/victim", params={"purge": "true"}, headers=tenant.admin)
    assert purged.status_code == 200, purged.text
    assert purged.json()["deleted"] == {
        "reviews": 0,
        "versions": 3,
        "memories": 1,
        "changesets": 3,
        "chunks": 1,
        "scopes": 1,
    }

    assert await _mentions(sessionmaker, f"{SECRET}-victim") == dict.fromkeys(CONTENT_TABLES, 0)
    keeper = await _mentions(sessionmaker, f"{SECRET}-keeper")
    # The other user keeps everything (the writer changeset records its ops, content included).
    assert keeper == {
        "chunks": 1,
        "memories": 1,
        "memory_versions": 1,
        "changesets": 1,
        "audit_events": 0,
        "reviews": 0,
    }
    assert (await client.get(f"/v1/memories/{victim.id}/history", headers=tenant.admin)).status_code == 404

    events = await _events(client, tenant, action="user.purged")
    assert len(events) == 1
    assert dry.json() == purged.json() | {"dry_run": True}
    assert (events[0]["target_id"], events[0]["summary"]) == ("victim", {"deleted": purged.json()["deleted"]})
    assert (await _verify(client, tenant))["ok"] is True
    # The exception was for that transaction only: history is append-only again.
    async with sessionmaker() as session:
        with pytest.raises(DBAPIError, match="append-only"):
            await session.execute(text("DELETE FROM memory_versions"))


async def _wait_for_a_lock_wait(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """Until another connection of this database waits for a lock (the purge, behind the ingestion)."""
    async with sessionmaker() as session:

        async def waiting() -> int:
            count = await session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
                )
            )
            await session.rollback()
            return int(count or 0)

        await wait_for(waiting, timeout_s=10, what="the purge waiting for the ingestion's lock")


async def test_a_purge_beside_an_ingestion_leaves_no_chunk_and_numbering_goes_on(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    """An ingestion that took its sequence number before the purge commits first, and its chunk is
    purged with the rest: the user's next chunks are numbered from 1 again without colliding with a
    chunk left behind."""
    body = {"user_id": "victim", "messages": [{"role": "user", "content": f"My code is {SECRET}."}]}
    assert (await client.post("/v1/chunks", json=body, headers=tenant.admin)).status_code == 202
    async with sessionmaker() as ingestion, ingestion.begin():
        # What a group commit does: take the scope's next seq (locking its row), then insert the chunk.
        last = await ScopeRepository(ingestion).allocate_seqs({(tenant.tenant_id, "victim"): 1})
        assert last == {(tenant.tenant_id, "victim"): 2}
        await PipelineRepository(ingestion).insert_many(
            [
                {
                    "id": uuid.uuid4(),
                    "tenant_id": tenant.tenant_id,
                    "user_id": "victim",
                    "seq": 2,
                    "messages": body["messages"],
                    "body_hash": "0" * 64,
                }
            ]
        )

        async def purge() -> dict[str, int]:
            async with sessionmaker() as session, session.begin():
                return await history.purge_user(session, tenant.tenant_id, "victim", who=Actor("test"))

        purging = asyncio.create_task(purge())
        await _wait_for_a_lock_wait(sessionmaker)
    counts = await purging
    assert (counts["chunks"], counts["scopes"]) == (2, 1)
    assert (await _mentions(sessionmaker, SECRET))["chunks"] == 0

    seqs = []
    for _ in range(2):
        again = await client.post("/v1/chunks", json=body, headers=tenant.admin)
        assert again.status_code == 202, again.text
        seqs.append(again.json()["seq"])
    assert seqs == [1, 2]
