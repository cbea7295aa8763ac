"""The Mem0-compatible routes in-process: filters run against real rows, hostile filters refused with
nothing changed, tenants and roles walled, and the routes absent unless asked for."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import AuditEvent, Chunk, Memory, MemoryVersion
from app.domain.memories.services import Provenance, apply_ops
from app.server.asgi import create_app
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.integration.accounts.test_auth import create_key
from tests.support.history import EMBEDDER


def token(key: str) -> dict[str, str]:
    return {"Authorization": f"Token {key}"}


@pytest.fixture
async def mem0(settings: Settings) -> AsyncIterator[AsyncTestClient[Litestar]]:
    app = create_app(settings.model_copy(update={"mem0_compat": True}), configure_logs=False)
    async with AsyncTestClient(app=app) as client:
        yield client


async def _bank(sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys) -> dict[str, str]:
    """Three memories of ana (one tagged, one by an agent, one of a run) and one of bo; text -> id."""
    ids = {}
    for user, agent, run, text, tags in [
        ("ana", None, None, "The user lives in Lyon.", ("home",)),
        ("ana", "bot", None, "The user likes 50% dark chocolate.", ("food",)),
        ("ana", None, "r1", "The user is vegetarian.", ("food", "diet")),
        ("bo", None, None, "The user mainly uses Python.", ()),
    ]:
        async with sessionmaker() as session, session.begin():
            await apply_ops(
                session,
                tenant_id=tenant.tenant_id,
                user_id=user,
                ops=[Op(OpKind.ADD, text, tags=tags)],
                shown={},
                provenance=Provenance(actor="worker:test", writer="w"),
                embedder=EMBEDDER,
                agent_id=agent,
                run_id=run,
            )
    async with sessionmaker() as session:
        for memory in (
            await session.scalars(select(Memory).where(Memory.tenant_id == tenant.tenant_id))
        ).all():
            ids[memory.content] = str(memory.id)
    return ids


async def _listed(client: AsyncTestClient[Litestar], key: str, filters: Any) -> list[str]:
    response = await client.post("/v3/memories/", json={"filters": filters}, headers=token(key))
    assert response.status_code == 200, response.text
    return sorted(m["memory"] for m in response.json()["results"])


LYON, CHOC, VEG, PY = (
    "The user lives in Lyon.",
    "The user likes 50% dark chocolate.",
    "The user is vegetarian.",
    "The user mainly uses Python.",
)


async def test_each_operator_and_connective_selects_the_right_memories(
    mem0: AsyncTestClient[Litestar], tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    ids = await _bank(sessionmaker, tenant)
    key = tenant.admin_key
    cases: list[tuple[Any, list[str]]] = [
        ({"user_id": "ana"}, [CHOC, VEG, LYON]),
        ({"user_id": {"eq": "bo"}}, [PY]),
        ({"user_id": {"ne": "ana"}}, [PY]),
        ({"user_id": "*"}, [CHOC, VEG, LYON, PY]),
        ({"agent_id": "*"}, [CHOC]),
        ({"agent_id": {"ne": "bot"}, "user_id": "ana"}, [VEG, LYON]),
        ({"run_id": {"in": ["r1", "r2"]}}, [VEG]),
        ({"run_id": {"nin": ["r1"]}}, [CHOC, LYON, PY]),
        ({"memory": {"contains": "50%"}}, [CHOC]),
        ({"memory": {"contains": "lyon"}}, []),
        ({"memory": {"icontains": "lyon"}}, [LYON]),
        ({"categories": {"contains": "food"}}, [CHOC, VEG]),
        ({"categories": {"in": ["home", "diet"]}}, [VEG, LYON]),
        ({"categories": {"nin": ["food"]}}, [LYON, PY]),
        ({"created_at": {"gte": "2000-01-01"}}, [CHOC, VEG, LYON, PY]),
        ({"created_at": {"gt": "2999-01-01T00:00:00Z"}}, []),
        ({"updated_at": {"lt": "2999-01-01"}, "user_id": "bo"}, [PY]),
        ({"updated_at": {"lte": "2000-01-01"}}, []),
        ({"id": {"in": [ids[LYON], ids[PY]]}}, [LYON, PY]),
        ({"memory_ids": {"ne": ids[LYON]}, "user_id": "ana"}, [CHOC, VEG]),
        ({"AND": [{"user_id": "ana"}, {"categories": {"contains": "food"}}]}, [CHOC, VEG]),
        ({"OR": [{"user_id": "bo"}, {"run_id": "r1"}]}, [VEG, PY]),
        ({"NOT": [{"user_id": "ana"}]}, [PY]),
        ({"AND": [{"user_id": "ana"}, {"NOT": {"OR": [{"agent_id": "bot"}, {"run_id": "r1"}]}}]}, [LYON]),
    ]
    for filters, expected in cases:
        assert await _listed(mem0, key, filters) == sorted(expected), filters

    response = await mem0.post(
        "/v3/memories/search/",
        json={"query": "chocolate", "filters": {"categories": {"contains": "food"}, "user_id": "ana"}},
        headers=token(key),
    )
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["memory"] == CHOC
    assert {r["memory"] for r in response.json()["results"]} <= {CHOC, VEG}


async def _state(sessionmaker: async_sessionmaker[AsyncSession]) -> tuple[int, ...]:
    async with sessionmaker() as session:
        return tuple(
            [
                int(await session.scalar(select(func.count()).select_from(model)) or 0)
                for model in (Memory, MemoryVersion, Chunk, AuditEvent)
            ]
        )


def _deep(depth: int) -> dict[str, Any]:
    filters: dict[str, Any] = {"user_id": "ana"}
    for _ in range(depth):
        filters = {"NOT": [filters]}
    return filters


async def test_hostile_filters_and_bodies_are_refused_and_change_nothing(
    mem0: AsyncTestClient[Litestar], tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    await _bank(sessionmaker, tenant)
    before = await _state(sessionmaker)
    headers = token(tenant.admin_key)
    hostile: list[tuple[str, str, Any]] = [
        ("POST", "/v3/memories/", {"filters": _deep(50)}),
        # Past the body's nesting bound too, as raw JSON (no encoder here nests that deep).
        (
            "POST",
            "/v3/memories/",
            '{"filters": ' + '{"NOT": [' * 2_000 + '{"user_id": "a"}' + "]}" * 2_000 + "}",
        ),
        ("POST", "/v3/memories/", {"filters": {"user_id": {"in": ["a"] * 100_000}}}),
        ("POST", "/v3/memories/", {"filters": {"user_id": ["ana"]}}),
        ("POST", "/v3/memories/", {"filters": {"created_at": {"gt": 12}}}),
        ("POST", "/v3/memories/", {"filters": {"user_id": "a\u0000"}}),
        ("POST", "/v3/memories/", {"filters": {"user_id": {"$where": "1"}}}),
        ("POST", "/v3/memories/", {"filters": {"metadata": {"k": "v"}}}),
        ("POST", "/v3/memories/", {"filters": "user_id = 'ana' OR 1=1"}),
        ("POST", "/v3/memories/search/", {"query": "x", "filters": {"OR": [{"user_id": {"gte": "a"}}]}}),
        ("POST", "/v3/memories/search/", {"query": "x", "top_k": 10_000}),
        (
            "POST",
            "/v3/memories/add/",
            {"messages": [{"role": "user", "content": "hi\u0000"}], "user_id": "ana"},
        ),
        ("POST", "/v3/memories/add/", {"messages": [{"role": "user", "content": "hi"}]}),
        (
            "POST",
            "/v3/memories/add/",
            {"messages": [{"role": "user", "content": "hi"}], "user_id": "a", "x": 1},
        ),
        (
            "POST",
            "/v3/memories/add/",
            {"messages": [{"role": "user", "content": "hi"}], "user_id": "a", "timestamp": -1},
        ),
        (
            "POST",
            "/v3/memories/add/",
            {"messages": [{"role": "user", "content": "hi"}], "user_id": "a", "app_id": "x"},
        ),
        ("PUT", "/v1/batch/", {"memories": [{"memory_id": str(uuid.uuid4()), "text": "x"}] * 1_001}),
        ("PUT", "/v1/batch/", {"memories": [{"memory_id": "nope", "text": "x"}]}),
        ("DELETE", "/v1/batch/", {"memories": []}),
        ("DELETE", "/v1/memories/", None),
        ("DELETE", "/v2/entities/app/x/", None),
    ]
    for method, path, body in hostile:
        if isinstance(body, str):
            response = await mem0.request(method, path, content=body, headers=headers)
        else:
            response = await mem0.request(method, path, json=body, headers=headers)
        assert 400 <= response.status_code < 500, (
            path,
            body if len(str(body)) < 200 else "...",
            response.text,
        )
        answer = response.json()
        assert "detail" in answer, (path, response.status_code, answer)
        assert answer["detail"] == answer["error"]["message"]  # what Mem0's client raises with
    assert await _state(sessionmaker) == before
    assert (await mem0.get("/health")).status_code == 200


async def test_other_tenants_and_lesser_keys_are_walled_off(
    mem0: AsyncTestClient[Litestar],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    ids = await _bank(sessionmaker, tenant)
    lyon = ids[LYON]
    before = await _state(sessionmaker)
    stranger = token(other_tenant.admin_key)
    for method, path, body in [
        ("GET", f"/v1/memories/{lyon}/", None),
        ("GET", f"/v1/memories/{lyon}/history/", None),
        ("PUT", f"/v1/memories/{lyon}/", {"text": "stolen"}),
        ("DELETE", f"/v1/memories/{lyon}/", None),
        ("PUT", "/v1/batch/", {"memories": [{"memory_id": lyon, "text": "stolen"}]}),
        ("DELETE", "/v1/batch/", {"memories": [{"memory_id": lyon}]}),
        ("POST", "/v1/feedback/", {"memory_id": lyon, "feedback": "NEGATIVE"}),
        ("DELETE", "/v2/entities/user/ana/", None),
    ]:
        response = await mem0.request(method, path, json=body, headers=stranger)
        assert response.status_code == 404, (method, path, response.text)
        assert "Lyon" not in response.text
    assert (await mem0.post("/v3/memories/", json={"filters": {"user_id": "*"}}, headers=stranger)).json()[
        "count"
    ] == 0
    found = await mem0.post("/v3/memories/search/", json={"query": "Lyon"}, headers=stranger)
    assert found.json()["results"] == []
    assert (await mem0.get("/v1/entities/", headers=stranger)).json()["results"] == []
    await mem0.delete("/v1/memories/?user_id=ana", headers=stranger)  # nothing of theirs to delete
    assert await _state(sessionmaker) == before

    reader = (await create_key(mem0, tenant, ["read"], name="reader"))["key"]
    for method, path, body in [
        (
            "POST",
            "/v3/memories/add/",
            {"messages": [{"role": "user", "content": "I live in Oslo."}], "user_id": "ana"},
        ),
        ("PUT", f"/v1/memories/{lyon}/", {"text": "changed"}),
        ("DELETE", f"/v1/memories/{lyon}/", None),
        ("DELETE", "/v1/memories/?user_id=ana", None),
        ("PUT", "/v1/batch/", {"memories": [{"memory_id": lyon, "text": "changed"}]}),
        ("DELETE", "/v1/batch/", {"memories": [{"memory_id": lyon}]}),
        ("DELETE", "/v2/entities/user/ana/", None),
    ]:
        response = await mem0.request(method, path, json=body, headers=token(reader))
        assert response.status_code == 403, (method, path, response.text)
    assert (await mem0.get(f"/v1/memories/{lyon}/", headers=token(reader))).json()["memory"] == LYON
    assert (await mem0.get("/v1/ping/", headers=token("ms_unknown"))).status_code == 401
    after = await _state(sessionmaker)
    assert after[:3] == before[:3]  # memories, versions, chunks (the new key is audited)


async def test_the_mem0_paths_are_absent_unless_asked_for(
    client: AsyncTestClient[Litestar], tenant: TenantKeys
) -> None:
    headers = token(tenant.admin_key)  # the Token scheme itself is accepted everywhere
    assert (await client.get("/v1/memories?user_id=ana", headers=headers)).status_code == 200
    for method, path, body in [
        ("GET", "/v1/ping/", None),
        ("POST", "/v3/memories/add/", {"messages": [{"role": "user", "content": "hi"}], "user_id": "ana"}),
        ("POST", "/v3/memories/", {"filters": {"user_id": "ana"}}),
        ("POST", "/v3/memories/search/", {"query": "hi", "filters": {"user_id": "ana"}}),
        ("GET", f"/v1/event/{uuid.uuid4()}/", None),
        ("PUT", "/v1/batch/", {"memories": []}),
        ("GET", "/v1/entities/", None),
        ("POST", "/v1/feedback/", {"memory_id": str(uuid.uuid4())}),
        ("GET", "/mem0/v1/ping", None),
    ]:
        response = await client.request(method, path, json=body, headers=headers)
        assert response.status_code in (404, 405), (method, path, response.status_code)
