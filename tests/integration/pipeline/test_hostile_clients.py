"""64 clients at once, a few of them hostile (NUL characters, times at the edge of the calendar, 5 MB
bodies): every other client's chunks are acknowledged, applied exactly once and in order, and the
hostile ones get a 4xx and leave nothing behind."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Chunk
from tests.conftest import TenantKeys
from tests.support.scenario import bank, changesets_per_chunk, order_violations, user_chunks
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]

GOOD_CLIENTS = 56
FACTS = ["I live in Lyon.", "I mainly use Python.", "I moved to Seattle last month."]


def hostile_bodies(client: int) -> list[tuple[dict[str, Any] | bytes, int]]:
    """What one hostile client sends, each with the status it must get."""
    user = f"hostile-{client}"
    base = user_chunks(user, facts=["I live in Paris."])[0]
    kind = client % 4
    if kind == 0:  # a NUL in the text, the user id or the metadata
        return [
            ({**base, "messages": [{"role": "user", "content": "I live in\u0000Paris."}]}, 422),
            ({**base, "user_id": f"{user}\u0000"}, 422),
            ({**base, "metadata": {"k\u0000": "v"}}, 422),
        ]
    if kind == 1:  # valid RFC 3339 whose UTC instant is outside the calendar
        return [
            ({**base, "messages": [{"role": "user", "content": "x", "created_at": moment}]}, 422)
            for moment in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00")
        ]
    if kind == 2:  # 5 MB
        return [
            (
                b'{"user_id": "big", "messages": [{"role": "user", "content": "' + b"x" * 5_000_000 + b'"}]}',
                413,
            )
        ]
    # metadata nested far past any decoder's comfort
    return [
        (
            b'{"user_id": "deep", "messages": [{"role": "user", "content": "x"}], "metadata": '
            + b'{"a":' * 3000
            + b"1"
            + b"}" * 3000
            + b"}",
            422,
        )
    ]


async def test_hostile_clients_among_64_hurt_no_one_else(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    statuses: list[tuple[str, int, int]] = []

    async def good(client: int) -> list[dict[str, Any]]:
        accepted = []
        for i, body in enumerate(user_chunks(f"good-{client:02d}", facts=FACTS)):
            headers = ingest_headers | {"Idempotency-Key": f"good-{client}-{i}"}
            response = await api.post("/v1/chunks", json=body, headers=headers)
            statuses.append(("good", response.status_code, 202))
            accepted.append(response.json())
            await asyncio.sleep(0)  # no wait: a turn for the other clients, so the requests interleave
        return accepted

    async def hostile(client: int) -> None:
        for _ in range(2):
            for body, expected in hostile_bodies(client):
                if isinstance(body, bytes):
                    headers = ingest_headers | {"content-type": "application/json"}
                    response = await api.post("/v1/chunks", content=body, headers=headers)
                else:
                    response = await api.post("/v1/chunks", json=body, headers=ingest_headers)
                statuses.append(("hostile", response.status_code, expected))
                await asyncio.sleep(0)  # no wait: a turn for the other clients

    results = await asyncio.gather(*(good(i) for i in range(GOOD_CLIENTS)), *(hostile(i) for i in range(8)))

    assert [s for s in statuses if s[1] != s[2]] == []
    assert len(statuses) == GOOD_CLIENTS * len(FACTS) + 2 * sum(len(hostile_bodies(i)) for i in range(8))
    accepted = [a for per_client in results[:GOOD_CLIENTS] for a in per_client]
    assert sorted({a["seq"] for a in accepted}) == [1, 2, 3]

    async with running_worker(pipeline_settings):
        counts = await wait_for_chunks(sessionmaker, tenant.tenant_id, len(accepted), timeout_s=120)
    assert counts == {"applied": GOOD_CLIENTS * len(FACTS)}
    async with sessionmaker() as session:
        users = set(await session.scalars(select(Chunk.user_id).distinct()))
        assert await session.scalar(select(func.count()).select_from(Chunk)) == GOOD_CLIENTS * len(FACTS)
    assert users == {f"good-{i:02d}" for i in range(GOOD_CLIENTS)}
    assert await order_violations(sessionmaker, tenant.tenant_id) == []
    assert set((await changesets_per_chunk(sessionmaker, tenant.tenant_id)).keys()) == {1}
    result = await bank(sessionmaker, tenant.tenant_id)
    for user in users:
        memories = {content: status for content, status, _ in result[user]["memories"]}
        # Applied in order: the move to Seattle came after, and superseded, Lyon.
        assert memories == {
            "The user lives in Lyon.": "superseded",
            "The user mainly uses Python.": "active",
            "The user lives in Seattle.": "active",
        }, user
