"""Every fault of the model server: the chunk ends as it should, the bank is unchanged or correctly
changed, nothing waits past its timeout, and the scope's later chunks go on."""

from __future__ import annotations

import json
import time
import uuid
from collections import deque
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client import REGISTRY
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Changeset, Chunk, Memory, MemoryVersion
from tests.conftest import TenantKeys
from tests.support.fake_llm import FakeLLM, Reply, protocol_responder
from tests.support.workers import running_worker, wait_for_chunks

Client = AsyncTestClient[Litestar]

GARBAGE = Reply(content="Sure! The user seems nice; nothing else to add.")
TRUNCATED_CONTENT = Reply(content='{"memories": ["The user likes', finish_reason="length")
HUGE = Reply.json(
    {
        "memories": ["x" * 5_000]
        + [f"The user keeps locker code {uuid.UUID(int=i * 7919).hex}." for i in range(80)]
    }
)

# marker in the first chunk's message -> the replies its calls get before the model behaves
FAULTS: dict[str, list[Reply]] = {
    "slow-timeout": [Reply(delay_s=30)],  # the request times out (1 s); the transport retries at once
    "http-500": [Reply(status=500)],
    "http-429": [Reply(status=429, headers={"Retry-After": "1"})],
    "broken-body": [Reply(body=b'{"choices": [{"message": {"content": "{\\"memo')] * 2,
    "not-json-body": [Reply(body=b"<html>Bad Gateway</html>")] * 2,
    "garbage-once": [GARBAGE],  # the repair request fixes it
    # repair fails, the retry fails: failed with the raw output (each answer a different one)
    "garbage-always": [Reply(content=f"Sure! The user seems nice ({i}).") for i in range(10)],
    "cut-off": [TRUNCATED_CONTENT] * 10,  # the same answer every time: failed on its first attempt
    "huge": [HUGE],
    "hang-forever": [Reply(delay_s=600)] * 10,  # every request times out, every attempt: failed
}
EXPECTED = {  # marker -> final status of its first chunk
    "garbage-always": "failed",
    "cut-off": "failed",
    "hang-forever": "failed",
}


class FaultyModel:
    """The fake model's responder: scripted faults for chunks carrying a marker, then good answers."""

    def __init__(self) -> None:
        self.plan = {marker: deque(replies) for marker, replies in FAULTS.items()}

    def __call__(self, body: dict[str, Any]) -> Reply:
        text = body["messages"][1]["content"]
        for marker, replies in self.plan.items():
            if marker in text and replies:
                return replies.popleft()
        return protocol_responder(body)


async def test_every_fault_ends_applied_or_failed_and_later_chunks_proceed(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    fake_llm.responder = FaultyModel()
    settings = llm_settings.model_copy(update={"writer_max_ops": 50})
    chunk_ids: dict[str, tuple[str, str]] = {}
    for marker in FAULTS:
        ids = []
        for day, text in ((1, f"Note {marker}: I live in Oslo."), (2, "I also play chess.")):
            chunk = {
                "user_id": marker,
                "writer": "simple",
                "messages": [{"role": "user", "content": text, "created_at": f"2026-11-0{day}T10:00:00Z"}],
            }
            response = await api.post("/v1/chunks", json=chunk, headers=ingest_headers)
            assert response.status_code == 202
            ids.append(response.json()["chunk_id"])
        chunk_ids[marker] = (ids[0], ids[1])

    started = time.monotonic()
    async with running_worker(settings):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 2 * len(FAULTS), timeout_s=90)
    # Three attempts of a hanging model: 3 x (writer timeout 5 s) plus backoff, well under a minute.
    assert time.monotonic() - started < 60

    async with sessionmaker() as session:
        for marker, (first_id, second_id) in chunk_ids.items():
            first = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(first_id)))
            second = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(second_id)))
            assert first is not None
            assert second is not None
            assert second.status == "applied", f"{marker}: a later chunk of the scope did not proceed"
            bank = dict(
                (
                    await session.execute(
                        select(Memory.content, Memory.status).where(
                            Memory.tenant_id == tenant.tenant_id, Memory.user_id == marker
                        )
                    )
                ).all()
            )
            assert bank.get("The user said: I also play chess.") == "active", marker
            expected = EXPECTED.get(marker, "applied")
            assert first.status == expected, f"{marker}: {first.status} ({first.last_error})"
            if expected == "failed":
                assert first.changeset_id is None
                assert not any("Oslo" in content for content in bank), f"{marker}: a failed chunk wrote"
                assert first.last_error
                if marker == "garbage-always":
                    assert first.attempts == 2, "unparseable output: one repair, one retry, then failed"
                if marker == "cut-off":
                    assert first.attempts == 1, "the same unusable answer twice at temperature 0: failed"
                if marker != "hang-forever":
                    assert (first.raw_output and "seems nice" in first.raw_output) or "cut off" in (
                        first.last_error or ""
                    )
            elif marker != "huge":
                assert bank.get(f"The user said: Note {marker}: I live in Oslo.") == "active", marker

        garbage = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(chunk_ids["garbage-always"][0])))
        assert garbage is not None
        assert garbage.raw_output is not None
        steps = json.loads(garbage.raw_output)
        assert [s["step"] for s in steps] == ["extract", "extract.repair"]

        repaired = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(chunk_ids["garbage-once"][0])))
        assert repaired is not None
        assert repaired.attempts == 1
        changeset = await session.get(Changeset, (tenant.tenant_id, repaired.changeset_id))
        assert changeset is not None
        assert changeset.usage["repairs"] == 1

        huge = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(chunk_ids["huge"][0])))
        assert huge is not None
        assert huge.status == "applied"
        changeset = await session.get(Changeset, (tenant.tenant_id, huge.changeset_id))
        assert changeset is not None
        guards = [g["guard"] for g in changeset.guards]
        assert guards.count("bad_content") == 1  # the 5,000-character memory
        assert guards.count("too_many_ops") == 81 - 50
        assert sum(1 for op in changeset.ops if op["op"] == "ADD") == 49

        for marker in ("http-500", "http-429", "slow-timeout"):  # retried inside one attempt
            chunk = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(chunk_ids[marker][0])))
            assert chunk is not None
            assert chunk.attempts == 1, marker


async def test_a_deterministic_model_that_repeats_its_unusable_answer_fails_the_chunk_at_once(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    stuck = '{"memory": "The user ..."}'
    fake_llm.responder = lambda body: Reply(content=stuck)
    tokens = {"writer": "simple", "model": "hy-memory", "kind": "completion"}
    before = REGISTRY.get_sample_value("memstore_writer_tokens_total", tokens) or 0.0
    chunk = {
        "user_id": "hal",
        "writer": "simple",
        "messages": [{"role": "user", "content": "I live in Oslo."}],
    }
    response = await api.post("/v1/chunks", json=chunk, headers=ingest_headers)
    assert response.status_code == 202
    async with running_worker(llm_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 1) == {"failed": 1}
    # The answer, the repair request answered the same, and nothing more: no retry of the chunk.
    assert len(fake_llm.requests) == 2
    # The tokens of a chunk that failed are counted all the same (a token per four characters).
    after = REGISTRY.get_sample_value("memstore_writer_tokens_total", tokens) or 0.0
    assert after - before == 2 * (len(stuck) // 4)
    assert all(body["temperature"] == 0 for body in fake_llm.requests)
    async with sessionmaker() as session:
        failed = await session.get(Chunk, (tenant.tenant_id, uuid.UUID(response.json()["chunk_id"])))
        assert failed is not None
        assert failed.attempts == 1
        assert "repeated its answer at temperature 0" in (failed.last_error or "")
        steps = json.loads(failed.raw_output or "[]")
        assert [(s["step"], s["output"]) for s in steps] == [("extract", stuck), ("extract.repair", stuck)]


# What servers answer to a response_format they cannot do, and what they do take.
def _error(message: str, **fields: Any) -> bytes:
    return json.dumps({"error": {"message": message, **fields}}).encode()


LLAMA_CPP = _error(
    'response_format type must be one of "text" or "json_object", but got: json_schema',
    type="invalid_request_error",
)
LLAMA_CPP_PYTHON = _error(
    "1 validation error for CreateChatCompletionRequest\nresponse_format.type\n"
    "  Input should be 'text' or 'json_object' [type=literal_error, input_value='json_schema']",
    type="internal_server_error",
)
NO_FORMAT = _error("response_format is not supported")
CONTEXT_LENGTH = _error(
    "This model's maximum context length is 4096 tokens. However, you requested 5120 tokens. "
    "Please reduce the length of the messages or completion.",
    type="BadRequestError",
)


def _sent_format(body: dict[str, Any]) -> str:
    sent = body.get("response_format")
    if sent is None:
        return "none"
    return "json_object_schema" if "schema" in sent else str(sent["type"])


@pytest.mark.parametrize(
    ("status", "refusal", "takes", "sent"),
    [
        # llama.cpp: takes the schema inside json_object (and enforces it); the same answer as 500
        (400, LLAMA_CPP, {"json_object_schema"}, ["json_schema", "json_object_schema", "json_object_schema"]),
        (500, LLAMA_CPP, {"json_object_schema"}, ["json_schema", "json_object_schema", "json_object_schema"]),
        (
            500,
            LLAMA_CPP_PYTHON,
            {"json_object_schema"},
            ["json_schema", "json_object_schema", "json_object_schema"],
        ),
        # no structured output at all: down to the prompt alone, a rung per refusal
        (400, NO_FORMAT, {"none"}, ["json_schema", "json_object_schema", "json_object", "none", "none"]),
        (422, NO_FORMAT, {"none"}, ["json_schema", "json_object_schema", "json_object", "none", "none"]),
    ],
)
async def test_a_server_that_refuses_the_schema_gets_the_next_form_and_the_chunks_apply(
    status: int,
    refusal: bytes,
    takes: set[str],
    sent: list[str],
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    def limited_server(body: dict[str, Any]) -> Reply:
        if _sent_format(body) not in takes:
            return Reply(status=status, body=refusal)
        return protocol_responder(body)

    fake_llm.responder = limited_server
    for day in (1, 2):
        chunk = {
            "user_id": "eve",
            "writer": "simple",
            "messages": [{"role": "user", "content": f"Fact {day}."}],
        }
        assert (await api.post("/v1/chunks", json=chunk, headers=ingest_headers)).status_code == 202
    async with running_worker(llm_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 2) == {"applied": 2}
    assert [_sent_format(body) for body in fake_llm.requests] == sent
    if "json_object_schema" in takes:
        assert fake_llm.requests[-1]["response_format"]["schema"]["required"] == ["memories"]
    async with sessionmaker() as session:
        attempts = (await session.execute(select(Chunk.attempts).where(Chunk.user_id == "eve"))).scalars()
        assert list(attempts) == [1, 1]  # falling back is not an attempt


async def test_a_context_length_error_fails_that_call_and_leaves_structured_output_on(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    fake_llm.enqueue(Reply(status=400, body=CONTEXT_LENGTH))
    for day in (1, 2):
        chunk = {
            "user_id": "fay",
            "writer": "simple",
            "messages": [{"role": "user", "content": f"Fact {day}."}],
        }
        assert (await api.post("/v1/chunks", json=chunk, headers=ingest_headers)).status_code == 202
    async with running_worker(llm_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 2) == {"applied": 2}
    # The refused call, its chunk's next attempt, the next chunk: every one asked for the schema.
    assert [_sent_format(body) for body in fake_llm.requests] == ["json_schema"] * 3
    async with sessionmaker() as session:
        chunks = (
            await session.execute(select(Chunk).where(Chunk.user_id == "fay").order_by(Chunk.seq))
        ).scalars()
        assert [chunk.attempts for chunk in chunks] == [2, 1]


async def test_text_postgres_cannot_hold_is_taken_out_of_the_ops_and_the_chunk_applies(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    fake_llm.enqueue(
        Reply.json({"memory": [{"content": "The user lives in Lyon.", "tags": ["home"], "owner": "user"}]}),
        Reply.json(
            {"memory": [{"content": "The user lives in Seattle.", "tags": ["home"], "owner": "user"}]}
        ),
        Reply.json(
            [
                {
                    "op": "SUPERSEDE",
                    "memory_ids": ["0"],
                    "content": "The user lives in\u0000 Seattle.\ud800",
                    "supersede_reason": "moved\u0000",
                    "owner": "user",
                    "tags": ["ho\u0000me", "\u0000"],
                }
            ]
        ),
    )
    for day, text in ((1, "I live in Lyon."), (20, "I moved to Seattle.")):
        chunk = {
            "user_id": "gus",
            "writer": "hy",
            "messages": [{"role": "user", "content": text, "created_at": f"2026-11-{day:02d}T10:00:00Z"}],
        }
        assert (await api.post("/v1/chunks", json=chunk, headers=ingest_headers)).status_code == 202
    async with running_worker(llm_settings):
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, 2) == {"applied": 2}

    async with sessionmaker() as session:
        chunk = (
            await session.execute(select(Chunk).where(Chunk.user_id == "gus", Chunk.seq == 2))
        ).scalar_one()
        assert chunk.attempts == 1
        memory = (
            await session.execute(select(Memory).where(Memory.user_id == "gus", Memory.status == "active"))
        ).scalar_one()
        assert (memory.content, memory.tags) == ("The user lives in Seattle.", ["home"])
        version = (
            await session.execute(select(MemoryVersion).where(MemoryVersion.memory_id == memory.id))
        ).scalar_one()
        assert version.reason == "moved"
        changeset = await session.get(Changeset, (chunk.tenant_id, chunk.changeset_id))
        assert changeset is not None
        assert [g["guard"] for g in changeset.guards] == ["unstorable_text"]
        assert changeset.ops[0]["content"] == "The user lives in Seattle."
        assert "\\ud800" in (changeset.raw_output or "")  # what the model said is kept, escaped
