"""A model's destructive ops held for a human: under `review` a prompt-injected "delete everything"
changes no memory until an admin approves; a rejection leaves the bank as it was; an approval applies
each op as a version with the writer's provenance; `deny` drops them; all of it is audited."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import AuditEvent, Changeset, Memory, MemoryVersion, Review
from tests.conftest import TenantKeys
from tests.integration.reviews.conftest import INJECTION
from tests.support.fake_llm import FakeLLM
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]
FACTS = ["I live in Lyon.", "I am vegetarian.", "I play chess on weekends."]


async def say(api: Client, headers: dict[str, str], text: str, writer: str | None = None) -> str:
    body: dict[str, Any] = {"user_id": "ana", "messages": [{"role": "user", "content": text}]}
    if writer:
        body["writer"] = writer
    response = await api.post("/v1/chunks", json=body, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["chunk_id"])


async def bank(sm: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID) -> dict[str, Any]:
    """Every memory and every version of the tenant, as rows."""
    async with sm() as session:
        memories = (
            await session.execute(
                select(Memory.id, Memory.content, Memory.status, Memory.version, Memory.changeset_id)
                .where(Memory.tenant_id == tenant_id)
                .order_by(Memory.id)
            )
        ).all()
        versions = (
            await session.execute(
                select(MemoryVersion.memory_id, MemoryVersion.version, MemoryVersion.op, MemoryVersion.status)
                .where(MemoryVersion.tenant_id == tenant_id)
                .order_by(MemoryVersion.memory_id, MemoryVersion.version)
            )
        ).all()
    return {"memories": [tuple(m) for m in memories], "versions": [tuple(v) for v in versions]}


async def actions(
    sm: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, prefix: str
) -> list[AuditEvent]:
    async with sm() as session:
        return list(
            (
                await session.scalars(
                    select(AuditEvent)
                    .where(AuditEvent.tenant_id == tenant_id, AuditEvent.action.startswith(prefix))
                    .order_by(AuditEvent.id)
                )
            ).all()
        )


async def three_facts_then_injection(
    api: Client, tenant: TenantKeys, settings: Settings, sm: async_sessionmaker[AsyncSession]
) -> tuple[dict[str, Any], str]:
    """The bank after three facts, and the id of the injected chunk (applied after them)."""
    async with running_worker(settings):
        for fact in FACTS:
            await say(api, tenant.admin, fact)
        await wait_for_chunks(sm, tenant.tenant_id, 3)
        before = await bank(sm, tenant.tenant_id)
        injected = await say(api, tenant.admin, INJECTION)
        assert await wait_for_chunks(sm, tenant.tenant_id, 4) == {"applied": 4}
    return before, injected


async def test_an_injected_delete_everything_waits_for_a_human(
    api: Client,
    tenant: TenantKeys,
    review_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    model: FakeLLM,
) -> None:
    response = await api.patch("/v1/admin/settings", json={"destructive_ops": "review"}, headers=tenant.admin)
    assert response.status_code == 200, response.text
    assert response.json()["destructive_ops"] == "review"
    before, injected = await three_facts_then_injection(api, tenant, review_settings, sessionmaker)
    assert len(before["memories"]) == 3

    # The model obeyed: its last answer deleted every memory it was shown. Nothing changed.
    assert INJECTION in str(model.requests[-1]["messages"])
    assert await bank(sessionmaker, tenant.tenant_id) == before
    listed = await api.get("/v1/admin/reviews?status=pending&user_id=ana", headers=tenant.admin)
    assert listed.status_code == 200, listed.text
    pending = listed.json()["items"]
    assert len(pending) == 3
    assert {r["op"]["op"] for r in pending} == {"DELETE"}
    assert {r["chunk_id"] for r in pending} == {injected}
    assert all(r["applicable"] and r["writer"] == "agent" and r["model"] == "agent-model" for r in pending)
    assert sorted(t["current_content"] for r in pending for t in r["targets"]) == sorted(
        m[1] for m in before["memories"]
    )
    async with sessionmaker() as session:
        changeset = await session.scalar(
            select(Changeset).where(Changeset.chunk_id == uuid.UUID(injected), Changeset.kind == "writer")
        )
    assert changeset is not None
    held = [g for g in changeset.guards if g["guard"] == "held_for_review"]
    assert sorted(g["detail"] for g in held) == sorted(f"held as review {r['id']}" for r in pending)
    assert len(await actions(sessionmaker, tenant.tenant_id, "review.held")) == 3
    # Later chunks see the memories as they are: all three still active, still shown to the writer.
    assert [m[2] for m in before["memories"]] == ["active"] * 3

    # Reject one: the bank stays identical.
    first, second, third = pending
    rejected = await api.post(
        f"/v1/admin/reviews/{first['id']}/reject", json={"reason": "prompt injection"}, headers=tenant.admin
    )
    assert rejected.status_code == 200, rejected.text
    assert (rejected.json()["status"], rejected.json()["decision_reason"]) == ("rejected", "prompt injection")
    assert await bank(sessionmaker, tenant.tenant_id) == before

    # Approve the others: each becomes a DELETE version under a `review` changeset with the writer's
    # provenance and the approver as actor.
    for review in (second, third):
        approved = await api.post(f"/v1/admin/reviews/{review['id']}/approve", headers=tenant.admin)
        assert approved.status_code == 200, approved.text
        assert approved.json()["status"] == "approved"
        assert approved.json()["decision_changeset_id"] is not None
    after = await bank(sessionmaker, tenant.tenant_id)
    statuses = {m[0]: m[2] for m in after["memories"]}
    approved_ids = {uuid.UUID(r["targets"][0]["memory_id"]) for r in (second, third)}
    assert {mid for mid, status in statuses.items() if status == "deleted"} == approved_ids
    assert statuses[uuid.UUID(first["targets"][0]["memory_id"])] == "active"
    async with sessionmaker() as session:
        written = (await session.scalars(select(Changeset).where(Changeset.kind == "review"))).all()
    assert len(written) == 2
    assert {(c.writer, c.model, c.chunk_id, c.actor.startswith("key:")) for c in written} == {
        ("agent", "agent-model", uuid.UUID(injected), True)
    }
    assert all(c.ops[0]["op"] == "DELETE" for c in written)

    # Decided once.
    again = await api.post(f"/v1/admin/reviews/{second['id']}/approve", headers=tenant.admin)
    assert (again.status_code, again.json()["error"]["code"]) == (409, "review_decided")
    again = await api.post(f"/v1/admin/reviews/{first['id']}/approve", headers=tenant.admin)
    assert (again.status_code, again.json()["error"]["code"]) == (409, "review_decided")
    assert (await api.get("/v1/admin/reviews", headers=tenant.admin)).json()["items"] == []
    decided = (await api.get("/v1/admin/reviews?status=all", headers=tenant.admin)).json()["items"]
    assert sorted(r["status"] for r in decided) == ["approved", "approved", "rejected"]

    audited = [e.action for e in await actions(sessionmaker, tenant.tenant_id, "review.")]
    assert audited == ["review.held"] * 3 + ["review.rejected", "review.approved", "review.approved"]

    # What the model wrote, its approved ops included, is undone by the bulk revert by model.
    everything_it_wrote = {"since": "2000-01-01T00:00:00Z", "model": "agent-model"}
    undone = await api.post("/v1/admin/revert", json=everything_it_wrote, headers=tenant.admin)
    assert undone.status_code == 200, undone.text
    assert {str(c.id) for c in written} <= set(undone.json()["reverted"])
    assert all(m[2] == "deleted" for m in (await bank(sessionmaker, tenant.tenant_id))["memories"])
    assert [e.action for e in await actions(sessionmaker, tenant.tenant_id, "tenant.destructive")] == [
        "tenant.destructive_ops_set"
    ]


async def test_approval_is_refused_once_the_memory_changed(
    api: Client, tenant: TenantKeys, review_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await api.patch("/v1/admin/settings", json={"destructive_ops": "review"}, headers=tenant.admin)
    await three_facts_then_injection(api, tenant, review_settings, sessionmaker)
    review = (await api.get("/v1/admin/reviews", headers=tenant.admin)).json()["items"][0]
    memory_id = review["targets"][0]["memory_id"]
    edited = await api.patch(
        f"/v1/memories/{memory_id}",
        json={"content": "The user lives in Lyon, near the river."},
        headers=tenant.admin,
    )
    assert edited.status_code == 200, edited.text
    after_edit = await bank(sessionmaker, tenant.tenant_id)

    shown = (await api.get(f"/v1/admin/reviews/{review['id']}", headers=tenant.admin)).json()
    assert shown["applicable"] is False
    assert (shown["targets"][0]["version"], shown["targets"][0]["current_version"]) == (1, 2)
    refused = await api.post(f"/v1/admin/reviews/{review['id']}/approve", headers=tenant.admin)
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "memory_changed")
    assert await bank(sessionmaker, tenant.tenant_id) == after_edit
    still = (await api.get(f"/v1/admin/reviews/{review['id']}", headers=tenant.admin)).json()
    assert still["status"] == "pending"
    missing = await api.post(f"/v1/admin/reviews/{uuid.uuid4()}/approve", headers=tenant.admin)
    assert missing.status_code == 404


async def test_a_writer_denied_by_the_writers_file_destroys_nothing_whatever_the_tenant_allows(
    api: Client, tenant: TenantKeys, review_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    settings = (await api.get("/v1/admin/settings", headers=tenant.admin)).json()
    assert settings["destructive_ops"] is None  # the deployment's: allow
    async with running_worker(review_settings):
        for fact in FACTS:
            await say(api, tenant.admin, fact, writer="strict")
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 3)
        before = await bank(sessionmaker, tenant.tenant_id)
        injected = await say(api, tenant.admin, INJECTION, writer="strict")
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 4)
    assert await bank(sessionmaker, tenant.tenant_id) == before
    async with sessionmaker() as session:
        changeset = await session.scalar(select(Changeset).where(Changeset.chunk_id == uuid.UUID(injected)))
        reviews = (await session.scalars(select(Review).where(Review.tenant_id == tenant.tenant_id))).all()
    assert changeset is not None
    assert [g["guard"] for g in changeset.guards] == ["denied_op"] * 3
    assert reviews == []


async def test_without_a_policy_the_model_deletes_as_before(
    api: Client, tenant: TenantKeys, review_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    """The control: the same injection under the default `allow` empties the bank (which is why the
    policy exists, and what the bulk revert by model undoes)."""
    await three_facts_then_injection(api, tenant, review_settings, sessionmaker)
    statuses = [m[2] for m in (await bank(sessionmaker, tenant.tenant_id))["memories"]]
    assert statuses == ["deleted"] * 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"destructive_ops": "sometimes"}, "destructive_ops"),
        ({"destructive_kinds": ["ADD"]}, "destructive_kinds"),
        ({"destructive_kinds": []}, "destructive_kinds"),
    ],
)
async def test_bad_policies_are_refused_and_change_nothing(
    api: Client, tenant: TenantKeys, body: dict[str, Any], field: str
) -> None:
    response = await api.patch("/v1/admin/settings", json=body, headers=tenant.admin)
    assert response.status_code in (400, 422), response.text
    assert field in response.text
    assert (await api.get("/v1/admin/settings", headers=tenant.admin)).json()[field] is None


async def test_a_review_is_decided_once_and_kept_until_a_purge(
    api: Client, tenant: TenantKeys, review_settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await api.patch("/v1/admin/settings", json={"destructive_ops": "review"}, headers=tenant.admin)
    await three_facts_then_injection(api, tenant, review_settings, sessionmaker)
    review = (await api.get("/v1/admin/reviews", headers=tenant.admin)).json()["items"][0]
    await api.post(f"/v1/admin/reviews/{review['id']}/reject", headers=tenant.admin)
    for statement in (
        "UPDATE reviews SET status = 'approved' WHERE id = :id",
        "UPDATE reviews SET op = '{}' WHERE id = :id",
        "DELETE FROM reviews WHERE id = :id",
    ):
        async with sessionmaker() as session:
            with pytest.raises(DBAPIError, match="reviews"):
                await session.execute(text(statement), {"id": review["id"]})
    purged = await api.delete("/v1/admin/users/ana?purge=true", headers=tenant.admin)
    assert purged.status_code == 200, purged.text
    assert purged.json()["deleted"]["reviews"] == 3
    assert (await api.get("/v1/admin/reviews?status=all", headers=tenant.admin)).json()["items"] == []
