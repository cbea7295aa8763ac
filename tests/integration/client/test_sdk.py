"""The SDK against the real service on a real socket with a real worker: typed answers, pages, errors
with the API's code, and ingestion retried under an idempotency key without a second chunk."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from memstore_client import AsyncClient, Client, MemstoreError, RetryPolicy, models
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.db.models import Chunk
from tests.conftest import TenantKeys
from tests.support.live import live_api
from tests.support.workers import running_worker

FACTS = ["I live in Lyon.", "I'm vegetarian.", "I mainly use Python.", "I moved to Seattle last month."]


@pytest.fixture
async def base_url(settings: Settings) -> AsyncIterator[str]:
    async with live_api(settings) as url, running_worker(settings):
        yield url


async def _chunks(sessionmaker: async_sessionmaker[AsyncSession]) -> int:
    async with sessionmaker() as session:
        return int(await session.scalar(select(func.count()).select_from(Chunk)) or 0)


def _said(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_the_blocking_client_ingests_pages_explains_and_undoes(
    base_url: str, tenant: TenantKeys
) -> None:
    def scenario() -> None:
        with Client(base_url, tenant.admin_key) as memstore:
            accepted = [memstore.add_chunk("ana", _said(fact)) for fact in FACTS]
            assert [a.seq for a in accepted] == [1, 2, 3, 4]
            states = memstore.wait_for_chunks([a.chunk_id for a in accepted], timeout_s=60)
            assert {s.status for s in states} == {"applied"}
            assert states[0].messages is not None
            assert [(m["role"], m["content"]) for m in states[0].messages] == [("user", "I live in Lyon.")]

            # Pages of one, iterated to the end.
            active = list(memstore.iter_memories("ana", limit=1))
            assert all(isinstance(m, models.Memory) for m in active)
            assert sorted(m.content for m in active) == [
                "The user is vegetarian.",
                "The user lives in Seattle.",
                "The user mainly uses Python.",
            ]
            every = list(memstore.iter_memories("ana", status="all", limit=2))
            lyon = next(m for m in every if m.content == "The user lives in Lyon.")
            assert lyon.status == "superseded"

            explained = memstore.explain(lyon.id)
            assert [v.version.op for v in explained.versions] == ["ADD", "SUPERSEDE"]
            assert explained.versions[0].source is not None
            assert explained.versions[0].source.messages[0]["content"] == "I live in Lyon."
            [best] = memstore.search("ana", "lives in Seattle", top_k=1)
            assert best.memory.content == "The user lives in Seattle."
            # Lyon held until the move "last month" began; what held before then is Lyon.
            assert lyon.valid_to is not None
            before = lyon.valid_to - timedelta(days=1)
            [then] = memstore.search("ana", "where does the user live", top_k=1, valid_at=before)
            assert then.memory.content == "The user lives in Lyon."
            held = memstore.list_memories("ana", valid_at=before).items
            assert "The user lives in Seattle." not in [m.content for m in held]
            assert "The user lives in Lyon." in [m.content for m in held]

            dry = memstore.rollback(lyon.id, 1, dry_run=True)
            assert dry.changeset_id is None
            assert [(d["before"]["status"], d["after"]["status"]) for d in dry.diff] == [
                ("superseded", "active")
            ]
            done = memstore.rollback(lyon.id, 1, reason="moved back")
            assert done.changeset_id is not None
            assert [v.op for v in memstore.history(lyon.id).versions] == ["ADD", "SUPERSEDE", "ROLLBACK"]
            assert [u.user_id for u in memstore.iter_users()] == ["ana"]
            assert memstore.verify_audit().ok

            with pytest.raises(MemstoreError) as missing:
                memstore.get_memory(uuid.uuid4())
            assert (missing.value.status, missing.value.code) == (404, "not_found")
            with pytest.raises(MemstoreError) as invalid:
                memstore.add_chunk("ana", [{"role": "narrator", "content": "x"}])
            assert (invalid.value.status, invalid.value.code) == (422, "validation_error")

    await asyncio.to_thread(scenario)


async def test_the_async_client_does_the_same_calls(base_url: str, tenant: TenantKeys) -> None:
    async with AsyncClient(base_url, tenant.admin_key) as memstore:
        accepted = await memstore.add_chunks(
            [
                {"user_id": "bo", "messages": _said(fact), "idempotency_key": f"bo-{i}"}
                for i, fact in enumerate(FACTS)
            ]
        )
        await memstore.wait_for_chunks([a.chunk_id for a in accepted], timeout_s=60)
        contents = [m.content async for m in memstore.iter_memories("bo", limit=1)]
        assert "The user lives in Seattle." in contents
        again = await memstore.add_chunks(
            [{"user_id": "bo", "messages": _said(FACTS[0]), "idempotency_key": "bo-0"}]
        )
        assert again[0].chunk_id == accepted[0].chunk_id
        writer_changesets = [c async for c in memstore.iter_changesets(user_id="bo", kind="writer")]
        assert len(writer_changesets) == 4
        with pytest.raises(MemstoreError) as refused:
            await AsyncClient(base_url, "ms_not-a-key").get_memory(uuid.uuid4())
        assert (refused.value.status, refused.value.code) == (401, "unauthorized")


class LoseTheFirstAnswers(httpx.AsyncBaseTransport):
    """A network that delivers the first `n` requests to the server and then drops their answers."""

    def __init__(self, n: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.left = n
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        self.sent += 1
        if self.left > 0:
            self.left -= 1
            await response.aread()
            raise httpx.ReadError("connection reset while reading the answer", request=request)
        return response


async def test_a_chunk_whose_answer_was_lost_is_retried_under_its_key_and_stored_once(
    base_url: str, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    network = LoseTheFirstAnswers(2)
    retry = RetryPolicy(max_retries=3, backoff_s=0.01)
    async with AsyncClient(base_url, tenant.admin_key, transport=network, retry=retry) as memstore:
        accepted = await memstore.add_chunk("cy", _said("I live in Lyon."))
    assert network.sent == 3  # the server saw it three times
    assert await _chunks(sessionmaker) == 1  # and stored it once
    assert accepted.seq == 1

    # A call that is not safe to repeat is not repeated: the error is the caller's to handle.
    network = LoseTheFirstAnswers(1)
    async with AsyncClient(base_url, tenant.admin_key, transport=network, retry=retry) as memstore:
        with pytest.raises(MemstoreError) as lost:
            await memstore.create_key("k", ["read"])
    assert (lost.value.code, network.sent) == ("unreachable", 1)


class Recording(httpx.AsyncBaseTransport):
    """The real network, noting the status of every answer."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.statuses: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        self.statuses.append(response.status_code)
        return response


async def test_rate_limited_calls_wait_as_told_and_go_through(
    settings: Settings, tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    limited = settings.model_copy(update={"rate_limit_per_s": 20.0, "rate_limit_burst": 2})
    network = Recording()
    async with live_api(limited) as url, AsyncClient(url, tenant.admin_key, transport=network) as memstore:
        accepted = await asyncio.gather(
            *(memstore.add_chunk("dee", _said(f"I like tea {i}.")) for i in range(8))
        )
    assert 429 in network.statuses  # the server refused some at first
    assert sorted(a.seq for a in accepted) == list(range(1, 9))
    assert await _chunks(sessionmaker) == 8
