"""POST /v1/answer: the read model's answer with the memories it was handed and where each came from;
501 without a read model, 503 when it is down; input checked like the rest of the API; tenants apart."""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.memories.services import Provenance, Shown, apply_ops
from app.embeddings import HashingEmbedder
from app.server.asgi import create_app
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys, bearer
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.fake_reader import reader_responder, shown_memories
from tests.support.history import db_now

EMBEDDER = HashingEmbedder(384)
SAID_ON = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


async def write(
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant_id: uuid.UUID,
    user_id: str,
    ops: list[Op],
    shown: dict[int, Shown] | None = None,
) -> uuid.UUID:
    """One writer changeset for a chunk, as the pipeline writes it; returns the chunk id."""
    chunk_id = uuid.uuid4()
    async with sessionmaker() as session, session.begin():
        outcome = await apply_ops(
            session,
            tenant_id=tenant_id,
            user_id=user_id,
            ops=ops,
            shown=shown or {},
            provenance=Provenance(
                actor="worker:test", writer="hy-prod", model="hy-memory", chunk_id=chunk_id
            ),
            embedder=EMBEDDER,
            memory_at=SAID_ON,
        )
        assert outcome.applied == len(ops), outcome.guards
    return chunk_id


@pytest.fixture
def reader() -> Iterator[FakeLLM]:
    with FakeLLM(responder=reader_responder, model="reader-7b").in_thread() as server:
        yield server


@pytest.fixture
async def answering(settings: Settings, reader: FakeLLM) -> AsyncIterator[AsyncTestClient[Litestar]]:
    app = create_app(
        settings.model_copy(update={"reader_base_url": reader.base_url, "reader_model": "reader-7b"}),
        configure_logs=False,
    )
    async with AsyncTestClient(app=app) as client:
        yield client


async def test_the_reader_is_told_when_each_fact_held(
    answering: AsyncTestClient[Litestar],
    reader: FakeLLM,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
) -> None:
    began, ended = datetime(2020, 1, 5, tzinfo=UTC), datetime(2024, 3, 10, tzinfo=UTC)
    await write(
        sessionmaker,
        tenant.tenant_id,
        "u",
        [
            Op(OpKind.ADD, "The user lived in Lyon.", valid_from=began, valid_to=ended),
            Op(OpKind.ADD, "The user lives in Seattle.", valid_from=ended),
            Op(OpKind.ADD, "The user plays the cello."),
        ],
    )
    question = {"user_id": "u", "question": "Where did the user live?", "top_k": 3}
    response = await answering.post("/v1/answer", json=question, headers=tenant.admin)
    assert response.status_code == 200, response.text
    [sent] = reader.requests
    prompt = sent["messages"][1]["content"]
    assert "[8 May 2023] The user lived in Lyon. (true from 5 January 2020 until 10 March 2024)" in prompt
    assert "[8 May 2023] The user lives in Seattle. (true from 10 March 2024)" in prompt
    assert "[8 May 2023] The user plays the cello.\n" in prompt + "\n"  # no validity known: none shown


async def test_the_answer_comes_with_the_memories_it_was_read_from_and_their_provenance(
    answering: AsyncTestClient[Litestar],
    reader: FakeLLM,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    lyon_chunk = await write(
        sessionmaker,
        tenant.tenant_id,
        "u",
        [Op(OpKind.ADD, "The user lives in Lyon."), Op(OpKind.ADD, "The user mainly uses Python.")],
    )
    await write(sessionmaker, tenant.tenant_id, "someone-else", [Op(OpKind.ADD, "The user lives in Oslo.")])
    await write(sessionmaker, other_tenant.tenant_id, "u", [Op(OpKind.ADD, "The user lives in Rome.")])

    response = await answering.post(
        "/v1/answer", json={"user_id": "u", "question": "Where does the user live?"}, headers=tenant.admin
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["answer"] == "The user lives in Lyon."
    assert body["model"] == "reader-7b"
    assert [m["memory"]["content"] for m in body["memories"]] == [
        "The user lives in Lyon.",
        "The user mainly uses Python.",
    ]
    first = body["memories"][0]
    assert first["score"] > body["memories"][1]["score"]
    assert first["provenance"]["version"] == 1
    assert first["provenance"]["chunk_id"] == str(lyon_chunk)
    assert first["provenance"]["writer"] == "hy-prod"
    assert first["provenance"]["model"] == "hy-memory"
    assert uuid.UUID(first["provenance"]["changeset_id"])
    assert datetime.fromisoformat(first["provenance"]["created_at"]) <= datetime.now(UTC)
    assert body["usage"]["prompt_tokens"] > 0
    assert body["usage"]["completion_tokens"] > 0
    # What the read model was sent: the same memories, dated, at temperature 0.
    [sent] = reader.requests
    assert sent["model"] == "reader-7b"
    assert sent["temperature"] == 0
    assert shown_memories(sent) == ["The user lives in Lyon.", "The user mainly uses Python."]
    assert "[8 May 2023] The user lives in Lyon." in sent["messages"][1]["content"]

    # A later write is what the reader sees now; as of before it, the earlier version is.
    before = await db_now(sessionmaker)
    lyon = uuid.UUID(first["memory"]["id"])
    moved_chunk = await write(
        sessionmaker,
        tenant.tenant_id,
        "u",
        [Op(OpKind.UPDATE, "The user lives in Paris.", (0,))],
        {0: Shown(lyon, 1)},
    )
    now = (
        await answering.post(
            "/v1/answer", json={"user_id": "u", "question": "Where does the user live?"}, headers=tenant.admin
        )
    ).json()
    assert now["answer"] == "The user lives in Paris."
    assert now["memories"][0]["provenance"]["version"] == 2
    assert now["memories"][0]["provenance"]["chunk_id"] == str(moved_chunk)
    then = (
        await answering.post(
            "/v1/answer",
            json={
                "user_id": "u",
                "question": "Where does the user live?",
                "as_of": before.isoformat(),
                "top_k": 1,
            },
            headers=tenant.admin,
        )
    ).json()
    assert then["answer"] == "The user lives in Lyon."
    assert [(m["memory"]["version"], m["provenance"]["chunk_id"]) for m in then["memories"]] == [
        (1, str(lyon_chunk))
    ]

    # Another tenant's key finds none of these memories for the same user id.
    theirs = (
        await answering.post(
            "/v1/answer",
            json={"user_id": "u", "question": "Where does the user live?"},
            headers=other_tenant.admin,
        )
    ).json()
    assert [m["memory"]["content"] for m in theirs["memories"]] == ["The user lives in Rome."]
    assert theirs["answer"] == "The user lives in Rome."


async def test_input_is_checked_like_the_rest_of_the_api_and_the_read_role_is_needed(
    answering: AsyncTestClient[Litestar], reader: FakeLLM, tenant: TenantKeys
) -> None:
    for body, field in (
        ({"user_id": "u", "question": "where\u0000"}, "question"),
        ({"user_id": "u\u0000", "question": "where?"}, "user_id"),
        ({"user_id": "u", "question": "where?", "as_of": "2026-11-30T10:00:00"}, None),
        ({"user_id": "u", "question": "where?", "as_of": "0001-01-01T00:00:00+14:00"}, None),
        ({"user_id": "u", "question": "where?", "top_k": 0}, None),
        ({"user_id": "u", "question": "where?", "top_k": 101}, "top_k"),
        ({"user_id": "u", "question": ""}, None),
        ({"question": "where?"}, None),
        ({"user_id": "u", "question": "where?", "mode": "vector"}, None),
    ):
        response = await answering.post("/v1/answer", json=body, headers=tenant.admin)
        assert response.status_code == 422, (body, response.text)
        error = response.json()["error"]
        assert error["code"] == "validation_error"
        if field is not None:
            assert field in str(error["details"]), (body, error)
    assert reader.requests == []

    keys = {}
    for roles in (["ingest"], ["read"]):
        created = await answering.post(
            "/v1/admin/keys", json={"name": "+".join(roles), "roles": roles}, headers=tenant.admin
        )
        keys[roles[0]] = bearer(created.json()["key"])
    forbidden = await answering.post(
        "/v1/answer", json={"user_id": "u", "question": "where?"}, headers=keys["ingest"]
    )
    assert forbidden.status_code == 403
    assert forbidden.json()["error"]["code"] == "forbidden"
    assert (
        await answering.post("/v1/answer", json={"user_id": "u", "question": "where?"})
    ).status_code == 401
    allowed = await answering.post(
        "/v1/answer", json={"user_id": "u", "question": "where?"}, headers=keys["read"]
    )
    assert allowed.status_code == 200
    assert allowed.json()["memories"] == []
    assert allowed.json()["answer"] == "I do not know."


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_no_read_model_is_501_and_one_that_is_down_or_refuses_is_503(
    settings: Settings, tenant: TenantKeys
) -> None:
    question = {"user_id": "u", "question": "Where does the user live?"}
    async with AsyncTestClient(app=create_app(settings, configure_logs=False)) as client:
        response = await client.post("/v1/answer", json=question, headers=tenant.admin)
    assert response.status_code == 501
    error = response.json()["error"]
    assert error["code"] == "reader_not_configured"
    assert "MEMSTORE_READER_BASE_URL" in error["message"]

    down = settings.model_copy(
        update={"reader_base_url": f"http://127.0.0.1:{_closed_port()}/v1", "reader_model": "reader-7b"}
    )
    async with AsyncTestClient(app=create_app(down, configure_logs=False)) as client:
        response = await client.post("/v1/answer", json=question, headers=tenant.admin)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "unavailable"
    assert "3 attempts" in response.json()["error"]["details"]["reader"]
    assert int(response.headers["retry-after"]) > 0

    with FakeLLM(model="reader-7b").in_thread() as refusing:
        refusing.enqueue(Reply(status=404, body=b'{"error": {"message": "no such model"}}'))
        app = create_app(
            settings.model_copy(update={"reader_base_url": refusing.base_url, "reader_model": "reader-7b"}),
            configure_logs=False,
        )
        async with AsyncTestClient(app=app) as client:
            response = await client.post("/v1/answer", json=question, headers=tenant.admin)
        assert response.status_code == 503
        assert "no such model" in response.json()["error"]["details"]["reader"]
        assert len(refusing.requests) == 1  # refused outright: not asked again


def test_the_openapi_document_lists_every_status_the_route_answers() -> None:
    nowhere = Settings(
        database_url="postgresql+asyncpg://unused@localhost/unused", redis_url="redis://unused"
    )
    document = create_app(nowhere, configure_logs=False).openapi_schema.to_schema()
    operation = document["paths"]["/v1/answer"]["post"]
    assert set(operation["responses"]) == {
        "200",
        "400",
        "401",
        "403",
        "409",
        "413",
        "422",
        "501",
        "429",
        "503",
    }
    assert operation["security"] == [{"bearer": []}]
    assert operation["responses"]["503"]["headers"]["Retry-After"]["required"] is True
    assert "reader_not_configured" in operation["responses"]["501"]["description"]
    provenance = document["components"]["schemas"]["SourceOut"]["properties"]
    assert set(provenance) == {"version", "changeset_id", "chunk_id", "writer", "model", "created_at"}
