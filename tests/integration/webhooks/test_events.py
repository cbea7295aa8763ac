"""A run of a user's life arrives at a receiver that verifies every delivery with `standardwebhooks`:
adds, a supersede, a hand update, a held review and its approval, a hand delete, a failed chunk; each
user's events in the order they were committed, each signature valid, nothing twice."""

from __future__ import annotations

from typing import Any

from app.config import Settings
from tests.conftest import TenantKeys
from tests.integration.webhooks.conftest import Client, create_webhook
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import WebhookReceiver
from tests.support.workers import running_worker


async def _ingest(api: Client, tenant: TenantKeys, user: str, text: str, **extra: Any) -> str:
    response = await api.post(
        "/v1/chunks",
        json={"user_id": user, "messages": [{"role": "user", "content": text}], **extra},
        headers=tenant.admin,
    )
    assert response.status_code == 202, response.text
    chunk_id: str = response.json()["chunk_id"]
    return chunk_id


async def _settled(api: Client, tenant: TenantKeys, chunk_id: str, timeout_s: float = 30) -> dict[str, Any]:
    async def chunk() -> dict[str, Any]:
        found: dict[str, Any] = (await api.get(f"/v1/chunks/{chunk_id}", headers=tenant.admin)).json()
        return found

    return await wait_for(
        chunk,
        lambda found: found["status"] in ("applied", "failed"),
        timeout_s=timeout_s,
        what=f"chunk {chunk_id} applied or failed",
    )


async def _memories(api: Client, tenant: TenantKeys, user: str) -> dict[str, str]:
    response = await api.get("/v1/memories", params={"user_id": user}, headers=tenant.admin)
    assert response.status_code == 200, response.text
    return {m["content"]: m["id"] for m in response.json()["items"]}


async def _deliveries(api: Client, tenant: TenantKeys, hook_id: str) -> list[dict[str, Any]]:
    response = await api.get(
        f"/v1/admin/webhooks/{hook_id}/deliveries", params={"limit": 100}, headers=tenant.admin
    )
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_a_run_of_events_arrives_signed_and_in_order(
    api: Client, api_settings: Settings, tenant: TenantKeys, receiver: WebhookReceiver
) -> None:
    hook = await create_webhook(api, tenant, receiver, include_content=True)
    assert hook["secret"].startswith("whsec_")
    listed = (await api.get("/v1/admin/webhooks", headers=tenant.admin)).json()["items"]
    assert [h["id"] for h in listed] == [hook["id"]]
    assert "secret" not in listed[0]

    # The tenant holds a writer's deletes for a human (its options are read by workers once per 30 s:
    # set before any runs).
    response = await api.patch(
        "/v1/admin/settings",
        json={"destructive_ops": "review", "destructive_kinds": ["DELETE"]},
        headers=tenant.admin,
    )
    assert response.status_code == 200, response.text

    async with running_worker(api_settings):
        for text in ("I live in Lyon.", "I like jazz."):
            await _settled(api, tenant, await _ingest(api, tenant, "ana", text))
        other = await _ingest(api, tenant, "bo", "I'm vegetarian.")
        await _settled(api, tenant, await _ingest(api, tenant, "ana", "I moved to Seattle."))
        await _settled(api, tenant, other)
        memories = await _memories(api, tenant, "ana")
        seattle = next(mid for content, mid in memories.items() if "Seattle" in content)
        response = await api.patch(
            f"/v1/memories/{seattle}",
            json={"content": "The user lives in Seattle, Washington."},
            headers=tenant.admin,
        )
        assert response.status_code == 200, response.text

        # The retraction is held for review (the tenant's policy), then approved.
        await _settled(api, tenant, await _ingest(api, tenant, "ana", "I don't like jazz anymore."))
        reviews = (await api.get("/v1/admin/reviews", headers=tenant.admin)).json()["items"]
        [review] = reviews
        response = await api.post(f"/v1/admin/reviews/{review['id']}/approve", json={}, headers=tenant.admin)
        assert response.status_code == 200, response.text

        response = await api.delete(f"/v1/memories/{seattle}", headers=tenant.admin)
        assert response.status_code in (200, 204), response.text
        failed = await _settled(
            api, tenant, await _ingest(api, tenant, "ana", "Hello there.", writer="garbage")
        )
        assert failed["status"] == "failed"

        expected_ana = [
            "memory.added", "chunk.applied",  # Lyon
            "memory.added", "chunk.applied",  # jazz
            "memory.added", "memory.superseded", "chunk.applied",  # Seattle replaces Lyon
            "memory.updated",  # the hand edit
            "review.held", "chunk.applied",  # the retraction, held
            "memory.deleted", "review.decided",  # approved
            "memory.deleted",  # the hand delete
            "chunk.failed",
        ]  # fmt: skip
        await receiver.wait_for(len(expected_ana) + 2)

        await wait_for(  # the worker records each answer after the receiver has it
            lambda: _deliveries(api, tenant, hook["id"]),
            lambda items: {d["status"] for d in items} == {"delivered"},
            timeout_s=30,
            what="every delivery recorded as delivered",
        )

    assert receiver.refused == []
    assert receiver.types("ana") == expected_ana
    assert receiver.types("bo") == ["memory.added", "chunk.applied"]
    ids = [d.webhook_id for d in receiver.received]
    assert len(set(ids)) == len(ids)  # nothing twice
    added = next(d for d in receiver.received if d.type == "memory.added")
    assert added.data["content"] == "The user lives in Lyon."
    assert added.data["writer"] is not None
    assert added.data["changeset_id"]
    held = next(d for d in receiver.received if d.type == "review.held")
    assert held.data["review_id"] == review["id"]

    deliveries = await _deliveries(api, tenant, hook["id"])
    assert {d["status"] for d in deliveries} == {"delivered"}
    assert sorted(d["webhook_id"] for d in deliveries) == sorted(ids)


async def test_contents_only_when_the_endpoint_opts_in(
    api: Client, api_settings: Settings, tenant: TenantKeys, receiver: WebhookReceiver
) -> None:
    await create_webhook(api, tenant, receiver, event_types=["memory.added"])
    async with running_worker(api_settings):
        await _settled(api, tenant, await _ingest(api, tenant, "ana", "I live in Lyon."))
        [added] = await receiver.wait_for(1)
    assert added.type == "memory.added"
    assert "content" not in added.data
    assert added.data["memory_id"]
    assert receiver.types() == ["memory.added"]  # chunk.applied not subscribed
