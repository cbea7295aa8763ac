"""A time named in a query ("in May 2023", "last week" at `reference_time`) raises the memories whose
fact held then, by `search_time_boost`; at 0, and for a query naming no time, nothing changes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.memories.services import ApplyLimits, Provenance, apply_ops
from app.embeddings import HashingEmbedder
from app.server.asgi import create_app
from app.writers.base import Op
from app.writers.base import OpKind as Kind
from tests.conftest import TenantKeys

Client = AsyncTestClient[Litestar]


def at(day: str) -> datetime:
    return datetime.fromisoformat(day).replace(tzinfo=UTC)


# (what was said, when, when the fact began, when it ended)
BANK = [
    ("The user went hiking with friends in the hills.", "2022-03-01", None, None),
    ("The user went hiking with her sister.", "2023-05-07", None, None),
    ("The user went hiking with her brother.", "2023-08-20", None, None),
    ("The user lived in Lyon.", "2020-01-05", "2020-01-05", "2024-03-10"),
    ("The user lives in Seattle.", "2024-03-10", "2024-03-10", None),
    # Said after it ended ("I lived in Paris until last month"): it held, as far as we know, before then.
    ("The user lived in Paris.", "2024-03-10", None, "2024-02-01"),
]


@pytest.fixture
async def bank(sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys) -> None:
    await add(sessionmaker, tenant, BANK)


async def add(
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    bank: list[tuple[str, str, str | None, str | None]],
) -> None:
    for content, said, began, ended in bank:
        async with sessionmaker() as session, session.begin():
            await apply_ops(
                session,
                tenant_id=tenant.tenant_id,
                user_id="u",
                ops=[
                    Op(
                        Kind.ADD,
                        content,
                        valid_from=at(began) if began else None,
                        valid_to=at(ended) if ended else None,
                    )
                ],
                shown={},
                provenance=Provenance(actor="test", writer="test"),
                embedder=HashingEmbedder(384),
                memory_at=at(said),
                limits=ApplyLimits(duplicate_threshold=1.01),
            )


@pytest.fixture
async def boosted(settings: Settings, bank: None) -> AsyncIterator[Client]:
    app = create_app(settings.model_copy(update={"search_time_boost": 1.0}), configure_logs=False)
    async with AsyncTestClient(app=app) as client:
        yield client


@pytest.fixture
async def plain(settings: Settings, bank: None) -> AsyncIterator[Client]:
    app = create_app(settings.model_copy(update={"search_time_boost": 0.0}), configure_logs=False)
    async with AsyncTestClient(app=app) as client:
        yield client


async def found(client: Client, tenant: TenantKeys, query: str, **body: Any) -> list[tuple[str, float]]:
    response = await client.post(
        "/v1/memories/search", json={"user_id": "u", "query": query, **body}, headers=tenant.admin
    )
    assert response.status_code == 200, response.text
    return [(r["memory"]["content"], r["score"]) for r in response.json()["results"]]


async def test_a_named_month_raises_what_happened_then(
    tenant: TenantKeys, plain: Client, boosted: Client
) -> None:
    query = "Who did I go hiking with in May 2023?"
    off = await found(plain, tenant, query)
    assert off[0][0] != "The user went hiking with her sister."  # the words alone do not tell
    on = await found(boosted, tenant, query)
    assert on[0][0] == "The user went hiking with her sister."
    assert all(0.0 <= score <= 1.0 for _, score in on)  # the boost keeps scores in their range


async def test_last_week_is_read_at_the_reference_time(tenant: TenantKeys, boosted: Client) -> None:
    query = "Who did I go hiking with last week?"
    sunday_after = await found(boosted, tenant, query, reference_time="2023-08-27T12:00:00Z")
    assert sunday_after[0][0] == "The user went hiking with her brother."
    week_after_may_7 = await found(boosted, tenant, query, reference_time="2023-05-10T12:00:00Z")
    assert week_after_may_7[0][0] == "The user went hiking with her sister."


async def test_a_fact_that_held_through_the_named_year_ranks_over_one_that_began_later(
    tenant: TenantKeys, plain: Client, boosted: Client
) -> None:
    query = "Where did the user live in 2022?"
    on, off = dict(await found(boosted, tenant, query)), dict(await found(plain, tenant, query))
    lyon, seattle = "The user lived in Lyon.", "The user lives in Seattle."
    assert on[lyon] > on[seattle]
    # With a boost of 1: Lyon held through 2022 (half the boost: x 1.5 / 2), Seattle began later (x 1 / 2).
    assert on[lyon] == pytest.approx(off[lyon] * 0.75)
    assert on[seattle] == pytest.approx(off[seattle] * 0.5)
    assert on["The user lived in Paris."] == pytest.approx(off["The user lived in Paris."] * 0.75)
    # Nor did Paris begin in March 2024, when it was said: it had ended by then.
    march = dict(await found(boosted, tenant, "Where did the user live in March 2024?"))
    march_off = dict(await found(plain, tenant, "Where did the user live in March 2024?"))
    assert march["The user lived in Paris."] == pytest.approx(march_off["The user lived in Paris."] * 0.5)
    assert march[seattle] == pytest.approx(march_off[seattle])  # began then: the full boost, x 2 / 2


async def test_a_query_naming_no_time_ranks_the_same_either_way(
    tenant: TenantKeys, plain: Client, boosted: Client
) -> None:
    for query in ("Who did I go hiking with?", "Where does the user live?"):
        assert await found(boosted, tenant, query) == await found(plain, tenant, query)


async def test_a_bad_reference_time_is_refused(tenant: TenantKeys, boosted: Client) -> None:
    for bad in ("last week", "2023-08-27", 12, "2023-08-27T12:00:00"):
        response = await boosted.post(
            "/v1/memories/search",
            json={"user_id": "u", "query": "hiking last week", "reference_time": bad},
            headers=tenant.admin,
        )
        assert response.status_code in (400, 422), (bad, response.text)


# The same bank's hikes told in German and in Chinese, each asked about in its own language.
HIKES_IN_LANGUAGES: list[tuple[str, str, str | None, str | None]] = [
    ("Der Nutzer war mit Freunden in den Bergen wandern.", "2022-03-01", None, None),
    ("Der Nutzer war mit seiner Schwester wandern.", "2023-05-07", None, None),
    ("Der Nutzer war mit seinem Bruder wandern.", "2023-08-20", None, None),
    ("用户和朋友们去山里徒步了。", "2022-03-01", None, None),
    ("用户和姐姐去徒步了。", "2023-05-07", None, None),
    ("用户和哥哥去徒步了。", "2023-08-20", None, None),
]


async def test_a_time_named_in_the_query_s_own_language_raises_what_happened_then(
    settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await add(sessionmaker, tenant, HIKES_IN_LANGUAGES)
    sunday_after = {"reference_time": "2023-08-27T12:00:00Z"}  # "last week" is the week of 20 August
    asked = [
        ("Mit wem war ich im Mai 2023 wandern?", {}, "Der Nutzer war mit seiner Schwester wandern."),
        ("Mit wem war ich letzte Woche wandern?", sunday_after, "Der Nutzer war mit seinem Bruder wandern."),
        ("2023年5月我和谁去徒步了？", {}, "用户和姐姐去徒步了。"),
        ("上周我和谁去徒步了？", sunday_after, "用户和哥哥去徒步了。"),
    ]
    for boost in (0.0, 1.0):
        app = create_app(settings.model_copy(update={"search_time_boost": boost}), configure_logs=False)
        async with AsyncTestClient(app=app) as client:
            for query, body, hike in asked:
                scores = dict(await found(client, tenant, query, **body))
                others = max(score for content, score in scores.items() if content != hike)
                if boost:
                    assert scores[hike] > others, (query, scores)
                else:
                    assert scores[hike] <= others, (query, scores)  # the words alone do not tell
