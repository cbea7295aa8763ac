"""Valid time through the whole pipeline with the offline writer: a fact replaced by a newer one stops
holding when the newer one was said, `valid_at` lists what held then (replaced facts included), and
undoing the replacement reopens the old fact's validity."""

from __future__ import annotations

from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import TenantKeys
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]


async def say(
    api: Client,
    headers: dict[str, str],
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    said: list[tuple[str, str]],
) -> None:
    """Ana says each (text, time) in turn, each applied by a worker before the next is posted."""
    async with running_worker(settings):
        for n, (text, at) in enumerate(said, 1):
            message = {"role": "user", "content": text, "created_at": at}
            response = await api.post(
                "/v1/chunks", json={"user_id": "ana", "messages": [message]}, headers=headers
            )
            assert response.status_code == 202, response.text
            await wait_for_chunks(sessionmaker, tenant.tenant_id, n)


async def held_at(api: Client, tenant: TenantKeys, moment: str, **params: Any) -> list[dict[str, Any]]:
    response = await api.get(
        "/v1/memories", params={"user_id": "ana", "valid_at": moment, **params}, headers=tenant.admin
    )
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_a_replaced_fact_held_until_the_new_one_and_undo_reopens_it(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    said = [("I live in Lyon.", "2020-01-05T10:00:00Z"), ("I moved to Seattle.", "2024-03-10T09:00:00Z")]
    await say(api, ingest_headers, pipeline_settings, sessionmaker, tenant, said)

    [lyon] = await held_at(api, tenant, "2022-06-01T00:00:00Z")
    assert lyon["content"] == "The user lives in Lyon."
    assert lyon["status"] == "superseded"  # replaced since, but it held then
    assert lyon["valid_to"] == "2024-03-10T09:00:00Z"
    [seattle] = await held_at(api, tenant, "2025-01-01T00:00:00Z")
    assert seattle["content"] == "The user lives in Seattle."
    assert seattle["valid_to"] is None
    assert await held_at(api, tenant, "2019-06-01T00:00:00Z") == []  # before anything was said
    # Another status asked for is kept: nothing deleted held then.
    assert await held_at(api, tenant, "2022-06-01T00:00:00Z", status="deleted") == []
    # Search reads the same valid time (exactly: replaced facts are in no index of current ones), for
    # one user or, within a bound on the tenant's size, for all of them.
    for moment, place in (("2022-06-01T00:00:00Z", "Lyon"), ("2025-01-01T00:00:00Z", "Seattle")):
        response = await api.post(
            "/v1/memories/search",
            json={"user_id": "ana", "query": "Where does the user live?", "valid_at": moment},
            headers=tenant.admin,
        )
        assert response.status_code == 200, response.text
        assert [r["memory"]["content"] for r in response.json()["results"]] == [f"The user lives in {place}."]
    response = await api.post(
        "/v1/memories/search",
        json={"all_users": True, "query": "Where does the user live?", "valid_at": "2022-06-01T00:00:00Z"},
        headers=tenant.admin,
    )
    assert response.status_code == 200, response.text
    assert [r["memory"]["content"] for r in response.json()["results"]] == ["The user lives in Lyon."]
    # Both times together: what the bank said on a day about an earlier day. Before the move was
    # written, nothing had closed Lyon yet.
    response = await api.get(
        "/v1/memories",
        params={"user_id": "ana", "valid_at": "2025-01-01T00:00:00Z", "as_of": lyon["created_at"]},
        headers=tenant.admin,
    )
    assert [m["content"] for m in response.json()["items"]] == ["The user lives in Lyon."]
    # The history shows validity on each version: open, then closed by the SUPERSEDE.
    response = await api.get(f"/v1/memories/{lyon['id']}/history", headers=tenant.admin)
    assert [(v["op"], v["valid_to"]) for v in response.json()["versions"]] == [
        ("ADD", None),
        ("SUPERSEDE", "2024-03-10T09:00:00Z"),
    ]

    # Undo the move: Lyon's validity reopens with its text and status.
    response = await api.get(f"/v1/memories/{seattle['id']}/history", headers=tenant.admin)
    changeset_id = response.json()["versions"][0]["changeset_id"]
    response = await api.post(f"/v1/admin/changesets/{changeset_id}/revert", json={}, headers=tenant.admin)
    assert response.status_code == 200, response.text
    [again] = await held_at(api, tenant, "2025-01-01T00:00:00Z")
    assert again["id"] == lyon["id"]
    assert again["status"] == "active"
    assert again["valid_to"] is None


async def test_the_offline_writer_reads_when_a_fact_began_from_its_sentence(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """ "I moved to Berlin last month", said on 10 March 2024 (Berlin time): the move, and so the old
    fact's end, was on 1 February; the message's own zone decides what "last month" is."""
    said = [
        ("I live in Lyon.", "2020-01-05T10:00:00Z"),
        ("I moved to Berlin last month.", "2024-03-10T09:00:00+01:00"),
    ]
    await say(api, ingest_headers, pipeline_settings, sessionmaker, tenant, said)
    [lyon] = await held_at(api, tenant, "2024-01-31T12:00:00Z")
    assert lyon["content"] == "The user lives in Lyon."
    assert lyon["valid_to"] == "2024-01-31T23:00:00Z"  # 1 February, midnight at +01:00
    [berlin] = await held_at(api, tenant, "2024-02-15T00:00:00Z")
    assert berlin["content"] == "The user lives in Berlin."
    assert berlin["valid_from"] == "2024-01-31T23:00:00Z"


@pytest.mark.parametrize(
    ("said", "old_place", "new_place", "tool", "last_month"),
    [
        pytest.param(
            [
                ("Ich wohne in Köln.", "2020-01-05T10:00:00Z"),
                (
                    "Ich bin letzten Monat nach Berlin gezogen und ich benutze hauptsächlich Python.",
                    "2024-03-10T09:00:00+01:00",
                ),
            ],
            "Der Nutzer wohnt in Köln.",
            "Der Nutzer wohnt in Berlin.",
            "Der Nutzer benutzt hauptsächlich Python.",
            "2024-01-31T23:00:00Z",  # 1 February, midnight at +01:00
            id="de",
        ),
        pytest.param(
            [
                ("我住在上海。", "2020-01-05T10:00:00Z"),
                ("我上个月搬到了北京，我主要用Python。", "2024-03-10T09:00:00+08:00"),
            ],
            "用户住在上海。",
            "用户住在北京。",
            "用户主要使用Python。",
            "2024-01-31T16:00:00Z",  # 1 February, midnight at +08:00
            id="zh",
        ),
    ],
)
async def test_in_another_language_a_time_phrase_dates_only_the_fact_of_its_clause(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    pipeline_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    said: list[tuple[str, str]],
    old_place: str,
    new_place: str,
    tool: str,
    last_month: str,
) -> None:
    """The move was last month, in the message's zone, and closes the place held before it then; the
    tool, in the sentence's other clause, is not dated by the move's phrase."""
    await say(api, ingest_headers, pipeline_settings, sessionmaker, tenant, said)

    [before] = await held_at(api, tenant, "2024-01-15T00:00:00Z")
    assert (before["content"], before["valid_to"]) == (old_place, last_month)
    now = {m["content"]: m["valid_from"] for m in await held_at(api, tenant, "2024-03-11T00:00:00Z")}
    assert now == {new_place: last_month, tool: None}
