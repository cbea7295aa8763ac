"""Memories that expire: `expires_at`, set by hand (`PATCH`), hides a memory from list and search
unless `include_expired=true`; it is a version like any other, so a revert or a rollback brings the
memory back; nothing is deleted by expiry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from memstore_client import AsyncClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys, bearer
from tests.support.history import memory, write
from tests.support.live import live_api

Client = AsyncTestClient[Litestar]

PAST = "2026-01-01T00:00:00Z"
FUTURE = "2099-01-01T00:00:00Z"


async def _key(client: Client, tenant: TenantKeys, *roles: str) -> dict[str, str]:
    response = await client.post(
        "/v1/admin/keys", json={"name": "k", "roles": list(roles)}, headers=tenant.admin
    )
    assert response.status_code == 201
    return bearer(response.json()["key"])


async def _listed(client: Client, headers: dict[str, str], **params: Any) -> list[str]:
    response = await client.get("/v1/memories", params={"user_id": "u", **params}, headers=headers)
    assert response.status_code == 200, response.text
    return [m["content"] for m in response.json()["items"]]


async def _found(client: Client, headers: dict[str, str], **body: Any) -> list[str]:
    response = await client.post(
        "/v1/memories/search", json={"user_id": "u", "query": "dentist Lyon", **body}, headers=headers
    )
    assert response.status_code == 200, response.text
    return [r["memory"]["content"] for r in response.json()["results"]]


async def test_an_expired_memory_is_hidden_unless_asked_for_and_a_revert_brings_it_back(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await write(
        sessionmaker,
        tenant.tenant_id,
        "u",
        [Op(OpKind.ADD, "The user lives in Lyon."), Op(OpKind.ADD, "The user sees the dentist on Friday.")],
    )
    dentist = await memory(sessionmaker, "The user sees the dentist on Friday.")
    editor = await _key(client, tenant, "read", "write")
    both = {"The user lives in Lyon.", "The user sees the dentist on Friday."}

    later = await client.patch(f"/v1/memories/{dentist.id}", json={"expires_at": FUTURE}, headers=editor)
    assert later.status_code == 200, later.text
    assert (later.json()["version"], later.json()["expires_at"]) == (2, "2099-01-01T00:00:00Z")
    assert set(await _listed(client, editor)) == both  # not expired yet
    assert set(await _found(client, editor)) == both

    expired = await client.patch(
        f"/v1/memories/{dentist.id}", json={"expires_at": PAST, "reason": "it was in January"}, headers=editor
    )
    assert expired.status_code == 200, expired.text
    assert (expired.json()["version"], expired.json()["status"]) == (3, "active")  # hidden, not deleted
    assert await _listed(client, editor) == ["The user lives in Lyon."]
    assert await _listed(client, editor, status="all") == ["The user lives in Lyon."]
    assert set(await _listed(client, editor, include_expired="true")) == both
    for mode in ("hybrid", "vector", "lexical"):
        assert await _found(client, editor, mode=mode) == ["The user lives in Lyon."], mode
        assert set(await _found(client, editor, mode=mode, include_expired=True)) == both, mode
    assert await _found(client, editor, all_users=True) == ["The user lives in Lyon."]
    # The one memory is still readable by id, with its expiry, and its history says who set it.
    one = (await client.get(f"/v1/memories/{dentist.id}", headers=editor)).json()
    assert one["expires_at"] == "2026-01-01T00:00:00Z"
    history = (await client.get(f"/v1/memories/{dentist.id}/history", headers=editor)).json()["versions"]
    assert [(v["op"], v["expires_at"], v["reason"]) for v in history] == [
        ("ADD", None, None),
        ("UPDATE", "2099-01-01T00:00:00Z", None),
        ("UPDATE", "2026-01-01T00:00:00Z", "it was in January"),
    ]
    # an edit that repeats the expiry writes nothing
    same = await client.patch(f"/v1/memories/{dentist.id}", json={"expires_at": PAST}, headers=editor)
    assert same.json()["version"] == 3

    # The changeset that set it, reverted: the memory is back, with the expiry it had before.
    changeset_id = history[2]["changeset_id"]
    reverted = await client.post(
        f"/v1/admin/changesets/{changeset_id}/revert", json={"reason": "not yet"}, headers=tenant.admin
    )
    assert reverted.status_code == 200, reverted.text
    back = (await client.get(f"/v1/memories/{dentist.id}", headers=editor)).json()
    assert (back["version"], back["expires_at"]) == (4, "2099-01-01T00:00:00Z")
    assert set(await _listed(client, editor)) == both
    assert set(await _found(client, editor)) == both

    # A rollback to the version that set it expires it again; a PATCH with null clears it.
    rolled = await client.post(
        f"/v1/admin/memories/{dentist.id}/rollback", json={"to_version": 3}, headers=tenant.admin
    )
    assert rolled.status_code == 200, rolled.text
    assert await _listed(client, editor) == ["The user lives in Lyon."]
    cleared = await client.patch(f"/v1/memories/{dentist.id}", json={"expires_at": None}, headers=editor)
    assert cleared.status_code == 200, cleared.text
    assert (cleared.json()["version"], cleared.json()["expires_at"]) == (6, None)
    assert set(await _listed(client, editor)) == both


async def test_as_of_reads_hide_what_had_expired_by_then(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user sees the dentist on Friday.")])
    dentist = await memory(sessionmaker, "The user sees the dentist on Friday.")
    editor = await _key(client, tenant, "read", "write")
    soon = datetime.now(UTC) + timedelta(hours=1)
    patched = await client.patch(
        f"/v1/memories/{dentist.id}", json={"expires_at": soon.isoformat()}, headers=editor
    )
    assert patched.status_code == 200, patched.text
    now = datetime.now(UTC) + timedelta(seconds=1)
    after = soon + timedelta(minutes=1)
    for as_of, expected in ((now, ["The user sees the dentist on Friday."]), (after, [])):
        assert await _listed(client, editor, as_of=as_of.isoformat()) == expected
        assert await _found(client, editor, as_of=as_of.isoformat(), query="dentist") == expected
    assert await _listed(client, editor, as_of=after.isoformat(), include_expired="true") == [
        "The user sees the dentist on Friday."
    ]


async def test_hostile_expiry_values_are_refused(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Lyon.")])
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    editor = await _key(client, tenant, "read", "write")
    for value in ("tomorrow", "2026-12-01T10:00:00", -1, 0, "0001-01-01T00:00:00+14:00", True, []):
        response = await client.patch(f"/v1/memories/{lyon.id}", json={"expires_at": value}, headers=editor)
        assert response.status_code == 422, (value, response.text)
    for params in ({"include_expired": "maybe"}, {"include_expired": "2"}):
        response = await client.get("/v1/memories", params={"user_id": "u", **params}, headers=editor)
        assert 400 <= response.status_code < 500, (params, response.text)
    response = await client.post(
        "/v1/memories/search",
        json={"user_id": "u", "query": "x", "include_expired": "true"},
        headers=editor,
    )
    assert response.status_code == 422, response.text
    assert (await client.get(f"/v1/memories/{lyon.id}", headers=editor)).json()["version"] == 1


async def test_the_sdk_sets_clears_and_reads_past_an_expiry(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user sees the dentist on Friday.")])
    dentist = await memory(sessionmaker, "The user sees the dentist on Friday.")
    async with live_api(settings) as url, AsyncClient(url, tenant.admin_key) as sdk:
        expired = await sdk.edit_memory(dentist.id, expires_at=datetime(2026, 1, 1, tzinfo=UTC))
        assert (expired.version, expired.expires_at) == (2, datetime(2026, 1, 1, tzinfo=UTC))
        assert (await sdk.list_memories("u")).items == []
        assert [m.id for m in (await sdk.list_memories("u", include_expired=True)).items] == [dentist.id]
        assert await sdk.search("u", "dentist") == []
        assert [r.memory.id for r in await sdk.search("u", "dentist", include_expired=True)] == [dentist.id]
        tagged = await sdk.edit_memory(dentist.id, tags=["health"])  # leaves the expiry as it was
        assert (tagged.version, tagged.expires_at) == (3, datetime(2026, 1, 1, tzinfo=UTC))
        cleared = await sdk.edit_memory(dentist.id, expires_at=None)
        assert (cleared.version, cleared.expires_at) == (4, None)
        history = await sdk.history(dentist.id)
        january = datetime(2026, 1, 1, tzinfo=UTC)
        assert [v.expires_at for v in history.versions] == [None, january, january, None]
