"""`POST /v1/admin/users/{user_id}/import`: an export's records land as they were written, under ids of
this tenant's own; loading twice writes nothing; bad records and taken numbers change nothing."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Changeset, Chunk, Memory, MemoryVersion
from tests.conftest import TenantKeys

Client = AsyncTestClient[Litestar]

CHUNK, CHANGESET, UPDATE_CHANGESET, MEMORY = (uuid.uuid4() for _ in range(4))


def exported() -> dict[str, Any]:
    """What `memstore export` writes for a user whose writer added a memory that an admin then edited."""
    return {
        "chunks": [
            {
                "type": "chunk",
                "chunk_id": str(CHUNK),
                "user_id": "ana",
                "seq": 1,
                "messages": [{"role": "user", "content": "I live in Lyon."}],
                "status": "applied",
                "received_at": "2026-01-02T10:00:00Z",
                "applied_at": "2026-01-02T10:00:01Z",
                "changeset_id": str(CHANGESET),
            }
        ],
        "changesets": [
            {
                "type": "changeset",
                "id": str(CHANGESET),
                "user_id": "ana",
                "kind": "writer",
                "status": "applied",
                "actor": "worker:a",
                "created_at": "2026-01-02T10:00:01Z",
                "chunk_id": str(CHUNK),
                "writer": "hy",
                "model": "hy-memory",
                "prompt_hash": "ab" * 32,
                "ops": [
                    {"index": 0, "op": "ADD", "content": "The user lives in Lyon.", "memory_id": str(MEMORY)}
                ],
            },
            {
                "type": "changeset",
                "id": str(UPDATE_CHANGESET),
                "user_id": "ana",
                "kind": "manual",
                "status": "applied",
                "actor": "key:k",
                "created_at": "2026-01-03T09:00:00Z",
                "reason": "typo",
            },
        ],
        "memories": [
            {
                "type": "memory",
                "id": str(MEMORY),
                "user_id": "ana",
                "content": "The user lives in Lyon, France.",
                "status": "active",
                "version": 2,
                "created_at": "2026-01-02T10:00:01Z",
                "updated_at": "2026-01-03T09:00:00Z",
                "valid_from": "2019-05-01T00:00:00Z",
                "expires_at": "2030-01-01T00:00:00Z",
                "versions": [
                    {
                        "version": 1,
                        "op": "ADD",
                        "content": "The user lives in Lyon.",
                        "status": "active",
                        "created_at": "2026-01-02T10:00:01Z",
                        "changeset_id": str(CHANGESET),
                        "chunk_id": str(CHUNK),
                        "actor": "worker:a",
                        "writer": "hy",
                        "model": "hy-memory",
                    },
                    {
                        "version": 2,
                        "op": "UPDATE",
                        "content": "The user lives in Lyon, France.",
                        "status": "active",
                        "created_at": "2026-01-03T09:00:00Z",
                        "changeset_id": str(UPDATE_CHANGESET),
                        "actor": "key:k",
                        "reason": "typo",
                        "valid_from": "2019-05-01T00:00:00Z",
                        "expires_at": "2030-01-01T00:00:00Z",
                    },
                ],
            }
        ],
    }


async def rows(sm: async_sessionmaker[AsyncSession]) -> dict[str, int]:
    async with sm() as session:
        return {
            model.__tablename__: int(await session.scalar(select(func.count()).select_from(model)) or 0)
            for model in (Chunk, Changeset, Memory, MemoryVersion)
        }


async def test_an_export_lands_as_written_once_under_this_tenants_ids(
    client: Client, tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    loaded = await client.post("/v1/admin/users/ana/import", json=exported(), headers=tenant.admin)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["written"] == {"changesets": 2, "chunks": 1, "memories": 1, "versions": 2}

    [memory] = (await client.get("/v1/memories", params={"user_id": "ana"}, headers=tenant.admin)).json()[
        "items"
    ]
    assert memory["content"] == "The user lives in Lyon, France."
    # Valid time and expiry come with the head and each version.
    assert (memory["valid_from"], memory["expires_at"]) == ("2019-05-01T00:00:00Z", "2030-01-01T00:00:00Z")
    history = (await client.get(f"/v1/memories/{memory['id']}/history", headers=tenant.admin)).json()
    assert [v["valid_from"] for v in history["versions"]] == [None, "2019-05-01T00:00:00Z"]
    assert memory["id"] != str(MEMORY)  # an id of this tenant's own
    explained = (await client.get(f"/v1/memories/{memory['id']}/explain", headers=tenant.admin)).json()
    first, second = explained["versions"]
    assert (first["version"]["op"], first["version"]["model"]) == ("ADD", "hy-memory")
    assert first["source"]["messages"][0]["content"] == "I live in Lyon."
    assert first["changeset"]["ops"][0]["memory_id"] == memory["id"]  # ids inside ops follow
    assert (second["version"]["actor"], second["version"]["reason"]) == ("key:k", "typo")
    # The past is the source's: as of before the edit, the writer's text.
    then = await client.get(
        "/v1/memories", params={"user_id": "ana", "as_of": "2026-01-02T12:00:00Z"}, headers=tenant.admin
    )
    assert [m["content"] for m in then.json()["items"]] == ["The user lives in Lyon."]
    # The user's numbering goes on after the imported chunk.
    posted = await client.post(
        "/v1/chunks",
        json={"user_id": "ana", "messages": [{"role": "user", "content": "hi"}]},
        headers=tenant.admin,
    )
    assert posted.json()["seq"] == 2

    again = await client.post("/v1/admin/users/ana/import", json=exported(), headers=tenant.admin)
    assert again.json()["written"] == {"changesets": 0, "chunks": 0, "memories": 0, "versions": 0}

    # A later export of the same user: what it adds lands, the rest is already here.
    later = exported()
    deleted = {**later["memories"][0]["versions"][1], "version": 3, "op": "DELETE", "status": "deleted"}
    later["memories"][0] |= {
        "version": 3,
        "status": "deleted",
        "versions": [*later["memories"][0]["versions"], deleted],
    }
    grown = await client.post("/v1/admin/users/ana/import", json=later, headers=tenant.admin)
    assert grown.json()["written"] == {"changesets": 0, "chunks": 0, "memories": 1, "versions": 1}
    now = (await client.get(f"/v1/memories/{memory['id']}", headers=tenant.admin)).json()
    assert (now["version"], now["status"]) == (3, "deleted")

    # Another tenant loading the same export gets rows of its own; neither sees the other's.
    theirs = await client.post("/v1/admin/users/ana/import", json=exported(), headers=other_tenant.admin)
    assert theirs.json()["written"] == {"changesets": 2, "chunks": 1, "memories": 1, "versions": 2}
    [other] = (
        await client.get("/v1/memories", params={"user_id": "ana"}, headers=other_tenant.admin)
    ).json()["items"]
    assert other["id"] != memory["id"]
    assert (await client.get(f"/v1/memories/{other['id']}", headers=tenant.admin)).status_code == 404


async def test_bad_records_and_taken_numbers_change_nothing(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    posted = await client.post(
        "/v1/chunks",
        json={"user_id": "bob", "messages": [{"role": "user", "content": "hi"}]},
        headers=tenant.admin,
    )
    assert posted.json()["seq"] == 1
    before = await rows(sessionmaker)

    taken = await client.post("/v1/admin/users/bob/import", json=exported(), headers=tenant.admin)
    assert taken.status_code == 409
    assert taken.json()["error"]["code"] == "import_conflict"

    unordered = copy.deepcopy(exported())
    unordered["memories"][0]["versions"].reverse()
    refused = await client.post("/v1/admin/users/cy/import", json=unordered, headers=tenant.admin)
    assert refused.status_code == 422
    assert refused.json()["error"]["details"]["field"] == "memories[0].versions"

    unknown_op = copy.deepcopy(exported())
    unknown_op["memories"][0]["versions"][0]["op"] = "OBLITERATE"
    assert (
        await client.post("/v1/admin/users/cy/import", json=unknown_op, headers=tenant.admin)
    ).status_code == 422
    assert await rows(sessionmaker) == before

    reader = await client.post("/v1/admin/keys", json={"name": "r", "roles": ["read"]}, headers=tenant.admin)
    read_key = {"Authorization": f"Bearer {reader.json()['key']}"}
    assert (
        await client.post("/v1/admin/users/cy/import", json=exported(), headers=read_key)
    ).status_code == 403
    assert await rows(sessionmaker) == before


async def test_each_text_keeps_the_language_it_was_written_in(
    client: Client, tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    """A text's language is the source's, not what this instance's detector makes of it: "Sushi, ramen,
    udon." was written as English there, and is read here as Danish when it is detected again."""
    record = exported()
    head = record["memories"][0]
    head["content"] = "Sushi, ramen, udon."
    head["language"] = "en"
    first, second = head["versions"]
    first |= {"content": "Sushi und Ramen.", "language": "de"}
    second |= {"content": "Sushi, ramen, udon.", "language": "en"}
    loaded = await client.post("/v1/admin/users/dan/import", json=record, headers=tenant.admin)
    assert loaded.status_code == 200, loaded.text

    [memory] = (await client.get("/v1/memories", params={"user_id": "dan"}, headers=tenant.admin)).json()[
        "items"
    ]
    assert memory["language"] == "en"
    history = (await client.get(f"/v1/memories/{memory['id']}/history", headers=tenant.admin)).json()
    assert [v["language"] for v in history["versions"]] == ["de", "en"]
    # Search reads it in its language: "ramen" is found as the English word it was written as.
    found = await client.post(
        "/v1/memories/search", json={"user_id": "dan", "query": "ramen"}, headers=tenant.admin
    )
    assert [r["memory"]["id"] for r in found.json()["results"]] == [memory["id"]]

    # An export from before languages were exported: each text's language is detected here.
    older = exported()
    for item in (older["memories"][0], *older["memories"][0]["versions"]):
        item.pop("language", None)
    loaded = await client.post("/v1/admin/users/dan/import", json=older, headers=other_tenant.admin)
    assert loaded.status_code == 200, loaded.text
    [plain] = (
        await client.get("/v1/memories", params={"user_id": "dan"}, headers=other_tenant.admin)
    ).json()["items"]
    assert plain["language"] == "en"

    bad = copy.deepcopy(record)
    bad["memories"][0]["language"] = "English; DROP"
    refused = await client.post("/v1/admin/users/fay/import", json=bad, headers=tenant.admin)
    assert refused.status_code == 422
