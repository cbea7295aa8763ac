"""Abuse limits: a key over its request rate and a user over its queue cap are refused (429 with
`Retry-After`) while 62 other clients, at the same moment, are not affected at all — and every chunk
that was accepted is applied exactly once."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Changeset, Chunk
from app.server.asgi import create_app
from tests.conftest import TenantKeys, bearer, make_tenant
from tests.support.waiting import wait_for
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]
CALM_CLIENTS = 62
CHUNKS_EACH = 5
SCOPE_CAP = 20


def _chunk(user: str, text: str) -> dict[str, Any]:
    return {"user_id": user, "messages": [{"role": "user", "content": text}]}


async def _key(client: Client, tenant: TenantKeys, name: str) -> dict[str, str]:
    response = await client.post(
        "/v1/admin/keys", json={"name": name, "roles": ["ingest", "read"]}, headers=tenant.admin
    )
    assert response.status_code == 201, response.text
    return bearer(response.json()["key"])


async def _post(client: Client, headers: dict[str, str], user: str, text: str) -> httpx.Response:
    return await client.post(
        "/v1/chunks",
        json=_chunk(user, text),
        headers=headers | {"Idempotency-Key": f"{user}-{text}"},
    )


async def test_one_greedy_key_and_one_flooded_user_leave_62_other_clients_untouched(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    limited = settings.model_copy(
        update={"rate_limit_per_s": 50.0, "rate_limit_burst": 100, "max_queued_per_scope": SCOPE_CAP}
    )
    calm, greedy = await make_tenant(sessionmaker), await make_tenant(sessionmaker)
    async with AsyncTestClient(create_app(limited, configure_logs=False)) as client:
        # The greedy tenant tightens its own keys' rate; it may not loosen the deployment's.
        loosen = await client.patch(
            "/v1/admin/settings", json={"rate_limit_per_s": 500}, headers=greedy.admin
        )
        assert (loosen.status_code, loosen.json()["error"]["details"]["field"]) == (422, "rate_limit_per_s")
        tighten = await client.patch(
            "/v1/admin/settings", json={"rate_limit_per_s": 1, "rate_limit_burst": 5}, headers=greedy.admin
        )
        assert tighten.status_code == 200, tighten.text
        calm_keys = [await _key(client, calm, f"app-{i}") for i in range(CALM_CLIENTS)]
        hog_key, greedy_key = await _key(client, calm, "hog"), await _key(client, greedy, "greedy")

        async def calm_client(i: int) -> list[int]:
            return [
                (await _post(client, calm_keys[i], f"user-{i}", f"fact {n}")).status_code
                for n in range(CHUNKS_EACH)
            ]

        async def hog() -> list[httpx.Response]:
            return [await _post(client, hog_key, "hog", f"flood {n}") for n in range(SCOPE_CAP * 2)]

        async def greedy_client() -> list[httpx.Response]:
            return list(
                await asyncio.gather(*(_post(client, greedy_key, "g", f"burst {n}") for n in range(30)))
            )

        calm_answers, hogged, greedy_answers = await asyncio.gather(
            asyncio.gather(*(calm_client(i) for i in range(CALM_CLIENTS))), hog(), greedy_client()
        )

        assert all(statuses == [202] * CHUNKS_EACH for statuses in calm_answers)
        assert [r.status_code for r in hogged] == [202] * SCOPE_CAP + [429] * SCOPE_CAP
        refused = hogged[-1]
        assert refused.json()["error"]["code"] == "queue_full"
        assert int(refused.headers["retry-after"]) >= 1
        greedy_statuses = [r.status_code for r in greedy_answers]
        assert set(greedy_statuses) == {202, 429}
        assert 5 <= greedy_statuses.count(202) <= 7  # the burst, and what a second or so refills
        limited_answer = next(r for r in greedy_answers if r.status_code == 429)
        assert limited_answer.json()["error"]["code"] == "rate_limited"
        assert int(limited_answer.headers["retry-after"]) >= 1

        # A refused request wrote nothing; its retry after the queue drained is accepted as new.
        accepted = {
            calm.tenant_id: CALM_CLIENTS * CHUNKS_EACH + SCOPE_CAP,
            greedy.tenant_id: greedy_statuses.count(202),
        }
        async with running_worker(limited):
            for tenant_id, expected in accepted.items():
                assert await wait_for_chunks(sessionmaker, tenant_id, expected) == {"applied": expected}
            again = await _post(client, hog_key, "hog", f"flood {SCOPE_CAP}")
            assert again.status_code == 202, again.text  # 202: written now (a replay answers 200)
            accepted[calm.tenant_id] += 1
            assert await wait_for_chunks(sessionmaker, calm.tenant_id, accepted[calm.tenant_id])

    async with sessionmaker() as session:
        for tenant_id, expected in accepted.items():
            chunks = await session.scalar(select(func.count()).where(Chunk.tenant_id == tenant_id))
            assert chunks == expected
        # Applied once: one writer changeset per applied chunk, none twice.
        per_chunk = (
            await session.execute(
                select(Changeset.chunk_id, func.count())
                .where(Changeset.kind == "writer", Changeset.tenant_id.in_(list(accepted)))
                .group_by(Changeset.chunk_id)
            )
        ).all()
        assert len(per_chunk) == sum(accepted.values())
        assert {n for _, n in per_chunk} == {1}
        assert all(isinstance(chunk_id, uuid.UUID) for chunk_id, _ in per_chunk)


async def test_limits_off_in_redis_outage_let_requests_through(
    settings: Settings, tenant: TenantKeys
) -> None:
    """Limits shield everyone else; they are not a source of truth. Without Redis, requests pass."""
    nowhere = settings.model_copy(
        update={"rate_limit_per_s": 1.0, "rate_limit_burst": 1, "redis_url": "redis://127.0.0.1:9/0"}
    )
    async with AsyncTestClient(create_app(nowhere, configure_logs=False)) as client:
        answers = [await client.get("/v1/admin/keys", headers=tenant.admin) for _ in range(5)]
    assert [a.status_code for a in answers] == [200] * 5


async def test_a_tenant_over_its_queue_cap_is_refused_whichever_user_it_writes_for(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    capped = settings.model_copy(update={"max_queued_per_tenant": 5})
    other = await make_tenant(sessionmaker)
    async with AsyncTestClient(create_app(capped, configure_logs=False)) as client:
        answers = [await _post(client, tenant.admin, f"user-{n % 3}", f"fact {n}") for n in range(7)]
        assert [a.status_code for a in answers] == [202] * 5 + [429] * 2
        refused = answers[-1].json()["error"]
        assert (refused["code"], refused["details"]) == ("queue_full", {"scope": "tenant"})
        # Another tenant's queue is its own.
        assert (await _post(client, other.admin, "user-0", "fact 0")).status_code == 202
    async with sessionmaker() as session:
        assert await session.scalar(select(func.count()).where(Chunk.tenant_id == tenant.tenant_id)) == 5


async def test_a_tenant_whose_queue_drained_is_admitted_again_once_recounted(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    """A tenant's count is taken again in the background once a second: a batch never waits for it,
    and the tenant is admitted again soon after its queue drained (well within `Retry-After`)."""
    capped = settings.model_copy(update={"max_queued_per_tenant": 3})
    async with AsyncTestClient(create_app(capped, configure_logs=False)) as client:
        answers = [await _post(client, tenant.admin, f"user-{n}", "fact") for n in range(4)]
        assert [a.status_code for a in answers] == [202] * 3 + [429]
        async with running_worker(capped):
            assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 3) == {"applied": 3}
        retry_after = int(answers[-1].headers["retry-after"])
        await wait_for(
            lambda: _post(client, tenant.admin, "user-3", "fact"),
            lambda again: again.status_code == 202,
            timeout_s=retry_after,
            what=f"the tenant admitted again within its Retry-After ({retry_after} s)",
            interval_s=0.2,
        )
