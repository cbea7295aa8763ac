"""Admin undo over HTTP: rollback, revert (with conflicts), restore, bulk revert by model — each a
new, attributed changeset that can itself be reverted; dry runs change nothing."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import AuditEvent, Changeset, MemoryVersion
from app.server.asgi import create_app
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.support.history import db_now, memory, write

Client = AsyncTestClient[Litestar]


async def _bank(
    client: Client, tenant: TenantKeys, user: str = "u", **params: str
) -> dict[str, tuple[str, int]]:
    response = await client.get(
        "/v1/memories",
        params={"user_id": user, "status": "all", "limit": "1000", **params},
        headers=tenant.admin,
    )
    assert response.status_code == 200, response.text
    return {m["content"]: (m["status"], m["version"]) for m in response.json()["items"]}


async def _versions(sessionmaker: async_sessionmaker[AsyncSession]) -> int:
    async with sessionmaker() as session:
        return len((await session.scalars(select(MemoryVersion.id))).all())


async def _post(
    client: Client, tenant: TenantKeys, path: str, body: dict[str, Any], status: int = 200
) -> Any:
    response = await client.post(path, json=body, headers=tenant.admin)
    assert response.status_code == status, response.text
    return response.json()


async def test_rollback_then_revert_the_rollback(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Lyon.")])
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    await write(
        sessionmaker, tenant.tenant_id, "u", [Op(OpKind.UPDATE, "The user lives in Paris.", (0,))], [lyon]
    )
    path = f"/v1/admin/memories/{lyon.id}/rollback"
    versions = await _versions(sessionmaker)

    dry = await _post(client, tenant, path, {"to_version": 1, "dry_run": True})
    assert dry["changeset_id"] is None
    assert dry["diff"] == [
        {
            "memory_id": str(lyon.id),
            "before": {"content": "The user lives in Paris.", "status": "active", "version": 2},
            "after": {"content": "The user lives in Lyon.", "status": "active", "version": 3},
        }
    ]
    assert await _versions(sessionmaker) == versions
    assert await _bank(client, tenant) == {"The user lives in Paris.": ("active", 2)}

    done = await _post(client, tenant, path, {"to_version": 1, "reason": "bad merge"})
    assert done["diff"] == dry["diff"]
    assert await _bank(client, tenant) == {"The user lives in Lyon.": ("active", 3)}
    history = (await client.get(f"/v1/memories/{lyon.id}/history", headers=tenant.admin)).json()["versions"]
    assert [v["op"] for v in history] == ["ADD", "UPDATE", "ROLLBACK"]
    assert history[2]["changeset_id"] == done["changeset_id"]
    assert history[2]["reason"] == "bad merge"
    assert history[2]["actor"].startswith("key:")
    changeset = (
        await client.get(f"/v1/admin/changesets/{done['changeset_id']}", headers=tenant.admin)
    ).json()
    assert (changeset["kind"], changeset["status"]) == ("rollback", "applied")

    await _post(client, tenant, path, {"to_version": 9}, status=404)  # no such version
    undone = await _post(client, tenant, f"/v1/admin/changesets/{done['changeset_id']}/revert", {})
    assert await _bank(client, tenant) == {"The user lives in Paris.": ("active", 4)}
    assert undone["reverted"] == [done["changeset_id"]]
    changeset = (
        await client.get(f"/v1/admin/changesets/{done['changeset_id']}", headers=tenant.admin)
    ).json()
    assert changeset["status"] == "reverted"


async def test_revert_conflicts_are_reported_and_force_resolves_them(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    first = await write(
        sessionmaker,
        tenant.tenant_id,
        "u",
        [Op(OpKind.ADD, "The user lives in Lyon."), Op(OpKind.ADD, "The user likes jazz.")],
    )
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    second = await write(
        sessionmaker,
        tenant.tenant_id,
        "u",
        [Op(OpKind.SUPERSEDE, "The user lives in Seattle.", (0,))],
        [lyon],
    )
    versions = await _versions(sessionmaker)

    refused = await client.post(f"/v1/admin/changesets/{first}/revert", json={}, headers=tenant.admin)
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "revert_conflict"
    assert [(c["memory_id"], c["changeset_id"], c["version"]) for c in error["details"]["conflicts"]] == [
        (str(lyon.id), str(second), 2)
    ]
    assert await _versions(sessionmaker) == versions

    dry = await _post(client, tenant, f"/v1/admin/changesets/{first}/revert", {"dry_run": True})
    assert len(dry["conflicts"]) == 1
    assert {d["after"]["status"] for d in dry["diff"]} == {"deleted"}
    assert await _versions(sessionmaker) == versions

    # Reverting the newer changeset first is conflict-free: Seattle goes, Lyon is back.
    await _post(client, tenant, f"/v1/admin/changesets/{second}/revert", {})
    assert await _bank(client, tenant) == {
        "The user lives in Lyon.": ("active", 3),
        "The user likes jazz.": ("active", 1),
        "The user lives in Seattle.": ("deleted", 2),
    }
    # The first changeset still conflicts (the revert touched Lyon after it); force undoes it anyway:
    # every memory it wrote goes back to its state before it, whatever happened since.
    await _post(client, tenant, f"/v1/admin/changesets/{first}/revert", {}, status=409)
    forced = await _post(client, tenant, f"/v1/admin/changesets/{first}/revert", {"force": True})
    assert len(forced["conflicts"]) == 2
    assert await _bank(client, tenant) == {
        "The user lives in Lyon.": ("deleted", 4),
        "The user likes jazz.": ("deleted", 2),
        "The user lives in Seattle.": ("deleted", 2),
    }
    again = await client.post(
        f"/v1/admin/changesets/{first}/revert", json={"force": True}, headers=tenant.admin
    )
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "already_reverted"


async def test_restore_as_of_and_revert_the_restore(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Lyon.")])
    await write(sessionmaker, tenant.tenant_id, "other", [Op(OpKind.ADD, "The other user likes tea.")])
    moment = await db_now(sessionmaker)
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    await write(
        sessionmaker, tenant.tenant_id, "u", [Op(OpKind.UPDATE, "The user lives in Rome.", (0,))], [lyon]
    )
    await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user likes chess.")])
    then = await _bank(client, tenant, as_of=moment.isoformat())
    before = await _bank(client, tenant)
    versions = await _versions(sessionmaker)

    dry = await _post(
        client, tenant, "/v1/admin/users/u/restore", {"as_of": moment.isoformat(), "dry_run": True}
    )
    assert len(dry["diff"]) == 2
    assert await _versions(sessionmaker) == versions

    done = await _post(client, tenant, "/v1/admin/users/u/restore", {"as_of": moment.isoformat()})
    assert done["diff"] == dry["diff"]
    after = await _bank(client, tenant)
    assert {c: s for c, (s, _) in after.items() if s == "active"} == {c: s for c, (s, _) in then.items()}
    assert after["The user likes chess."] == ("deleted", 2)
    assert await _bank(client, tenant, "other") == {"The other user likes tea.": ("active", 1)}
    async with sessionmaker() as session:
        ops = set(
            (
                await session.scalars(
                    select(MemoryVersion.op).where(
                        MemoryVersion.changeset_id == uuid.UUID(done["changeset_id"])
                    )
                )
            ).all()
        )
    assert ops == {"RESTORE"}

    await _post(client, tenant, f"/v1/admin/changesets/{done['changeset_id']}/revert", {})
    assert {c: s for c, (s, _) in (await _bank(client, tenant)).items()} == {
        c: s for c, (s, _) in before.items()
    }


async def test_bulk_revert_by_model_newest_first(
    client: Client, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await write(sessionmaker, tenant.tenant_id, "a", [Op(OpKind.ADD, "A lives in Lyon.")], model="good")
    since = await db_now(sessionmaker)
    lyon = await memory(sessionmaker, "A lives in Lyon.")
    await write(
        sessionmaker,
        tenant.tenant_id,
        "a",
        [Op(OpKind.UPDATE, "A lives in Mars.", (0,))],
        [lyon],
        model="bad",
    )
    lyon = await memory(sessionmaker, "A lives in Mars.")
    await write(
        sessionmaker,
        tenant.tenant_id,
        "a",
        [Op(OpKind.UPDATE, "A lives on Venus.", (0,))],
        [lyon],
        model="bad",
    )
    await write(sessionmaker, tenant.tenant_id, "b", [Op(OpKind.ADD, "B is a robot.")], model="bad")
    await write(sessionmaker, tenant.tenant_id, "b", [Op(OpKind.ADD, "B likes tea.")], model="good")

    dry = await _post(
        client, tenant, "/v1/admin/revert", {"model": "bad", "since": since.isoformat(), "dry_run": True}
    )
    assert len(dry["reverted"]) == 3
    done = await _post(client, tenant, "/v1/admin/revert", {"model": "bad", "since": since.isoformat()})
    assert done["conflicts"] == []
    assert len(done["changeset_ids"]) == 2  # one revert changeset per user
    assert await _bank(client, tenant, "a") == {"A lives in Lyon.": ("active", 4)}
    assert await _bank(client, tenant, "b") == {
        "B is a robot.": ("deleted", 2),
        "B likes tea.": ("active", 1),
    }
    async with sessionmaker() as session:
        statuses = dict(
            (
                await session.execute(
                    select(Changeset.model, Changeset.status).where(
                        Changeset.kind == "writer", Changeset.status == "reverted"
                    )
                )
            ).all()
        )
        created = list(
            (
                await session.scalars(
                    select(Changeset).where(Changeset.model == "bad").order_by(Changeset.created_at.desc())
                )
            ).all()
        )
    assert statuses == {"bad": "reverted"}
    assert done["reverted"] == [str(c.id) for c in created]  # newest first

    listing = (
        await client.get("/v1/admin/changesets", params={"kind": "revert"}, headers=tenant.admin)
    ).json()
    assert len(listing["items"]) == 2
    assert all(item["raw_output"] is None for item in listing["items"])
    raw = (await client.get(f"/v1/admin/changesets/{created[0].id}", headers=tenant.admin)).json()
    assert raw["raw_output"] == '{"ops": 1}'
    async with sessionmaker() as session:
        reads = (
            await session.scalars(
                select(AuditEvent.target_id).where(AuditEvent.action == "changeset.raw_read")
            )
        ).all()
        bulk = (
            await session.scalars(
                select(AuditEvent.summary).where(AuditEvent.action == "changesets.reverted")
            )
        ).all()
    assert reads == [str(created[0].id)]
    assert len(bulk) == 1
    assert bulk[0]["filter"]["model"] == "bad"


async def test_undo_needs_the_admin_role_and_stays_in_the_tenant(
    client: Client,
    tenant: TenantKeys,
    other_tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    changeset = await write(sessionmaker, tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Lyon.")])
    lyon = await memory(sessionmaker, "The user lives in Lyon.")
    created = await client.post(
        "/v1/admin/keys", json={"name": "rw", "roles": ["read", "write"]}, headers=tenant.admin
    )
    writer_key = {"Authorization": f"Bearer {created.json()['key']}"}
    for path, body in [
        (f"/v1/admin/changesets/{changeset}/revert", {}),
        (f"/v1/admin/memories/{lyon.id}/rollback", {"to_version": 1}),
        ("/v1/admin/users/u/restore", {"as_of": "2026-01-01T00:00:00Z"}),
    ]:
        assert (await client.post(path, json=body, headers=writer_key)).status_code == 403
        # Another tenant's admin sees nothing of this tenant: its ids are unknown there.
        other = await client.post(path, json=body, headers=other_tenant.admin)
        assert other.status_code == (200 if "users" in path else 404), path
    assert (
        await client.get(f"/v1/admin/changesets/{changeset}", headers=other_tenant.admin)
    ).status_code == 404
    assert (await client.get("/v1/admin/audit", headers=writer_key)).status_code == 403
    assert await _bank(client, tenant) == {"The user lives in Lyon.": ("active", 1)}


async def test_a_bulk_revert_over_its_bound_is_refused_with_the_count_and_changes_nothing(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    since = await db_now(sessionmaker)
    for user, fact in (("a", "A likes tea."), ("a", "A likes jazz."), ("b", "B likes rain.")):
        await write(sessionmaker, tenant.tenant_id, user, [Op(OpKind.ADD, fact)], model="bad")
    bounded = settings.model_copy(update={"max_bulk_revert_changesets": 2})
    async with AsyncTestClient(create_app(bounded, configure_logs=False)) as client:
        before = {user: await _bank(client, tenant, user) for user in "ab"}
        body = {"model": "bad", "since": since.isoformat()}
        refused = await _post(client, tenant, "/v1/admin/revert", body, status=422)
        assert refused["error"]["code"] == "too_many_changesets"
        assert refused["error"]["details"] == {"matching": 3, "most": 2}
        assert {user: await _bank(client, tenant, user) for user in "ab"} == before
        # Narrowed to one user, it is within the bound and goes through.
        done = await _post(client, tenant, "/v1/admin/revert", body | {"user_id": "a"})
        assert len(done["reverted"]) == 2
        assert await _bank(client, tenant, "a") == {
            "A likes tea.": ("deleted", 2),
            "A likes jazz.": ("deleted", 2),
        }
        assert await _bank(client, tenant, "b") == before["b"]
