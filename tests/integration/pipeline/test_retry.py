"""An admin's retry of a failed chunk: queued again with fresh attempts, audited, and applied."""

from __future__ import annotations

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import TenantKeys
from tests.integration.audit.test_audit_log import _events
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]


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
