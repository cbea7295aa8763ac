"""The audit log over HTTP (listing, verification that finds tampering), failed-chunk retry, and
the GDPR purge that removes a user's content everywhere but leaves a content-free audit event."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.history import services as history
from app.domain.ingest.repositories import ChunkRepository, ScopeRepository
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.support.history import memory, write
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]


async def _events(client: Client, tenant: TenantKeys, **params: str) -> list[dict[str, object]]:
    response = await client.get("/v1/admin/audit", params=params, headers=tenant.admin)
    assert response.status_code == 200, response.text
    return list(response.json()["items"])


async def _verify(client: Client, tenant: TenantKeys) -> dict[str, object]:
    response = await client.get("/v1/admin/audit/verify", headers=tenant.admin)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize(
    ("tamper", "broken_at"),
    [
        (["UPDATE audit_events SET summary = '{\"memories\": 0}' WHERE seq = 4"], 4),
        (["DELETE FROM audit_events WHERE seq = 3"], 3),
        (
            [
                "UPDATE audit_events SET seq = seq + 100 WHERE seq >= 2",
                "INSERT INTO audit_events "
                "(tenant_id, seq, actor, action, summary, created_at, prev_hash, hash) "
                "SELECT tenant_id, 2, 'mallory', 'forged', '{}', now(), prev_hash, hash "
                "FROM audit_events WHERE seq = 102",
            ],
            2,
        ),
    ],
    ids=["changed", "deleted", "inserted"],
)
async def test_audit_lists_what_happened_and_verify_finds_tampering(
    client: Client,
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
    tamper: list[str],
    broken_at: int,
) -> None:
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Lyon.")])
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    headers = tenant.admin | {"X-Request-ID": "req-edit-1"}
    edited = await client.patch(
        f"/v1/memories/{lyon.id}", json={"content": "The user lives in Oslo."}, headers=headers
    )
    assert edited.status_code == 200
    rolled = await client.post(
        f"/v1/admin/memories/{lyon.id}/rollback", json={"to_version": 1}, headers=tenant.admin
    )
    assert rolled.status_code == 200

    events = await _events(client, tenant)
    actions = [e["action"] for e in events]
    assert actions == ["tenant.created", "api_key.created", "memory.updated", "memory.rolled_back"]
    updated = events[2]
    assert (updated["target_type"], updated["target_id"], updated["request_id"]) == (
        "memory",
        str(lyon.id),
        "req-edit-1",
    )
    assert str(updated["actor"]).startswith("key:")
    assert "Oslo" not in str(events)  # events say what happened, not what the memory says
    assert [e["action"] for e in await _events(client, tenant, action="memory.updated")] == ["memory.updated"]
    first = (await client.get("/v1/admin/audit", params={"limit": "3"}, headers=tenant.admin)).json()
    rest = await _events(client, tenant, cursor=first["next_cursor"])
    assert [e["action"] for e in first["items"] + rest] == actions

    assert await _verify(client, tenant) == {
        "ok": True,
        "checked": 4,
        "unsealed": 0,
        "broken_at_seq": None,
        "reason": None,
    }
    async with sessionmaker() as session, session.begin():
        # As the database owner would: with the append-only trigger switched off.
        await session.execute(text("SET LOCAL session_replication_role = replica"))
        for statement in tamper:
            await session.execute(text(statement))
    verdict = await _verify(client, tenant)
    assert (verdict["ok"], verdict["broken_at_seq"]) == (False, broken_at)
    assert verdict["checked"] == broken_at - 1


async def test_retry_requeues_a_failed_chunk_and_a_worker_applies_it(
    client: Client, tenant: TenantKeys, settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    body = {"user_id": "u", "messages": [{"role": "user", "content": "I live in Lyon."}]}
    chunk_id = (await client.post("/v1/chunks", json=body, headers=tenant.admin)).json()["chunk_id"]
    async with sessionmaker() as session, session.begin():
        await session.execute(
            text(
                "UPDATE chunks SET status = 'failed', attempts = 5, last_error = 'writer timed out' "
                "WHERE id = :id"
            ),
            {"id": chunk_id},
        )
    dry = await client.post(
        f"/v1/admin/chunks/{chunk_id}/retry", json={"dry_run": True}, headers=tenant.admin
    )
    assert dry.status_code == 200, dry.text
    assert (dry.json()["status"], dry.json()["dry_run"]) == ("queued", True)
    assert (await client.get(f"/v1/chunks/{chunk_id}", headers=tenant.admin)).json()["status"] == "failed"
    retried = await client.post(f"/v1/admin/chunks/{chunk_id}/retry", headers=tenant.admin)
    assert retried.status_code == 200, retried.text
    assert retried.json()["status"] == "queued"
    status = (await client.get(f"/v1/chunks/{chunk_id}", headers=tenant.admin)).json()
    assert (status["status"], status["attempts"], status["error"]) == ("queued", 0, None)
    again = await client.post(f"/v1/admin/chunks/{chunk_id}/retry", headers=tenant.admin)
    assert (again.status_code, again.json()["error"]["code"]) == (409, "chunk_not_failed")
    missing = await client.post(
        "/v1/admin/chunks/00000000-0000-0000-0000-000000000000/retry", headers=tenant.admin
    )
    assert missing.status_code == 404

    async with running_worker(settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 1) == {"applied": 1}
    listing = (await client.get("/v1/memories", params={"user_id": "u"}, headers=tenant.admin)).json()
    assert [m["content"] for m in listing["items"]] == ["The user lives in Lyon."]
    assert "chunk.retried" in [e["action"] for e in await _events(client, tenant)]


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
        for _ in range(400):
            waiting = await session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
                )
            )
            await session.rollback()
            if waiting:
                return
            await asyncio.sleep(0.025)
    pytest.fail("the purge never waited for the ingestion's lock")


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
        await ChunkRepository(ingestion).insert_many(
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
                return await history.purge_user(
                    session, tenant.tenant_id, "victim", who=history.Actor("test")
                )

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
