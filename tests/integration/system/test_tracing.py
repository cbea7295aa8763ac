"""One trace per chunk, across processes: the API (`memstore serve`) and a worker (`memstore worker`) as
processes of their own, exporting over OTLP/HTTP to a receiver this test runs, the writer a model server
speaking HTTP. The chunk's trace is the client's (`traceparent`), and holds the request, the group
commit, the worker's processing, the writer's GenAI call with its tokens, and the apply."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import TenantKeys, writers_toml
from tests.support.fake_llm import FakeLLM
from tests.support.live import free_port
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.waiting import wait_for
from tests.support.workers import settings_env, start_worker_process, stop_worker_process, wait_until


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


@pytest.fixture
async def otlp() -> AsyncIterator[OtlpReceiver]:
    async with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def traced_settings(settings: Settings, fake_llm: FakeLLM, tmp_path: Path) -> Settings:
    """The writer `simple` on the fake model server, the embeddings too."""
    writers = tmp_path / "writers.toml"
    model: dict[str, object] = {"profile": "simple", "base_url": fake_llm.base_url, "model": "hy-memory"}
    trial = {**model, "model": "trial-model"}
    writers.write_text(writers_toml({"simple": model, "trial": trial}))
    return settings.model_copy(
        update={
            "writers_file": writers,
            "writer": "simple",
            "embedder": "openai",
            "embedder_base_url": fake_llm.base_url,
            "graph_index_budget_s": 0.0,
        }
    )


def otel_env(otlp: OtlpReceiver) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within a tenth of a second, not five
    }


@contextlib.contextmanager
def api_process(settings: Settings, env: dict[str, str], log_path: Path) -> Iterator[str]:
    port = free_port()
    log = log_path.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=settings_env(settings) | env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_worker_process(proc)


async def wait_healthy(base_url: str, log_path: Path) -> None:
    async def up() -> bool:
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"{base_url}/health")).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        await wait_until(up, 60, "the API process")
    except AssertionError:
        raise AssertionError(log_path.read_text()[-3000:]) from None


def by_name(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    named: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


@pytest.mark.timeout(180)
async def test_a_chunk_is_one_trace_across_the_api_and_the_worker(
    traced_settings: Settings,
    tenant: TenantKeys,
    otlp: OtlpReceiver,
    sessionmaker: async_sessionmaker[AsyncSession],
    tmp_path: Path,
) -> None:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    env = otel_env(otlp)
    # Content on the worker's spans only: the API's must then hold none of it.
    content = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
    worker = start_worker_process(traced_settings, tmp_path / "worker.log", env | content)
    try:
        with api_process(traced_settings, env, tmp_path / "api.log") as base_url:
            await wait_healthy(base_url, tmp_path / "api.log")
            async with httpx.AsyncClient(base_url=base_url, headers=tenant.admin, timeout=30) as client:
                # A shadow writer gets the chunk too: its run is a trace of its own, linked to this one.
                shadowed = await client.patch("/v1/admin/settings", json={"shadow_writers": ["trial"]})
                assert shadowed.status_code == 200, shadowed.text
                response = await client.post(
                    "/v1/chunks",
                    json={
                        "user_id": "alice",
                        "messages": [{"role": "user", "content": "I moved to Lisbon and I drive a Tesla."}],
                    },
                    headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
                )
                assert response.status_code == 202, response.text
                chunk_id = response.json()["chunk_id"]

                async def applied() -> bool:
                    status = (await client.get(f"/v1/chunks/{chunk_id}")).json()["status"]
                    assert status != "failed", (tmp_path / "worker.log").read_text()[-3000:]
                    return bool(status == "applied")

                await wait_until(applied, 60, "the chunk applied")
                search_trace = secrets.token_hex(16)
                found = await client.post(
                    "/v1/memories/search",
                    json={"user_id": "alice", "query": "Where does the user live?"},
                    headers={"traceparent": f"00-{search_trace}-{secrets.token_hex(8)}-01"},
                )
                assert found.status_code == 200, found.text
            searched = await otlp.wait_for(search_trace, {"search_memory"})
            names = {
                "POST /v1/chunks",
                "ingest group commit",
                "process chunk",
                "chat hy-memory",
                "update_memory",
            }
            spans = await otlp.wait_for(trace_id, names)
            await wait_for(
                lambda: any(trace_id in s.links for s in otlp.spans),
                timeout_s=30,
                what="the shadow writer's linked trace",
            )
    finally:
        stop_worker_process(worker)

    named = by_name(spans)
    assert names <= set(named), (
        f"the trace holds {sorted(named)}; all spans: {sorted({s.name for s in otlp.spans})}"
    )
    [server] = [s for s in named["POST /v1/chunks"] if s.kind == "SERVER"]
    assert server.parent_id == client_span, "the API's span continues the client's traceparent"
    assert server.service == "memstore-api"
    [commit] = named["ingest group commit"]
    assert commit.service == "memstore-api"
    assert commit.attributes["memstore.batch.chunks"] >= 1

    [process] = named["process chunk"]
    assert process.service == "memstore-worker", "the processing is the worker process's"
    assert process.kind == "CONSUMER"
    assert process.attributes["memstore.chunk.id"] == chunk_id
    assert process.attributes["memstore.chunk.outcome"] == "applied"
    ids = {s.span_id: s for s in spans}
    # The processing hangs under the request's span, which the API stored with the chunk.
    assert ids[process.parent_id].service == "memstore-api"

    [writer] = named["write memory ops"]
    assert writer.parent_id == process.span_id
    assert writer.attributes["memstore.writer.profile"] == "simple"
    chat = named["chat hy-memory"]
    assert all(call.kind == "CLIENT" and ids[call.parent_id].name == "write memory ops" for call in chat)
    for call in chat:
        assert call.attributes["gen_ai.operation.name"] == "chat"
        assert call.attributes["gen_ai.request.model"] == "hy-memory"
        assert call.attributes["memstore.writer.profile"] == "simple"
        assert call.attributes["gen_ai.usage.input_tokens"] > 0
        assert call.attributes["gen_ai.usage.output_tokens"] > 0
        assert call.attributes["gen_ai.response.finish_reasons"] == ["stop"]
        assert call.attributes["memstore.writer.attempts"] == 1
    # The HTTP request to the model server is a span of the call (the maintained aiohttp instrumentation).
    chat_ids = {call.span_id for call in chat}
    assert any(s.kind == "CLIENT" and s.parent_id in chat_ids for s in spans)

    [apply] = named["update_memory"]
    assert apply.parent_id == process.span_id
    assert apply.attributes["gen_ai.memory.store.id"] == str(tenant.tenant_id)
    async with sessionmaker() as session:
        changeset = await session.scalar(
            text("SELECT changeset_id::text FROM chunks WHERE id = :id"), {"id": chunk_id}
        )
    assert apply.attributes["memstore.changeset.id"] == changeset
    assert apply.attributes["gen_ai.memory.record.count"] >= 1
    [commit] = named["apply group commit"]
    assert commit.parent_id == apply.span_id
    assert commit.attributes["memstore.batch.chunks"] >= 1
    assert ids[named["embeddings"][0].parent_id] is process
    # Postgres statements of a request are spans of its trace (the key's lookup); those outside any
    # trace (the workers' polls, the sweeper) are not exported at all.
    assert any(s.service == "memstore-api" and "db.system" in s.attributes for s in spans)
    assert all(
        s.parent_id for s in otlp.spans if "db.system" in s.attributes or "db.system.name" in s.attributes
    )
    # A search is a `search_memory` span, with the store and how many memories it found.
    [search] = [s for s in searched if s.name == "search_memory"]
    assert search.attributes["gen_ai.operation.name"] == "search_memory"
    assert search.attributes["gen_ai.memory.store.id"] == str(tenant.tenant_id)
    assert search.attributes["gen_ai.memory.record.count"] == len(found.json()["results"])
    # The worker's log lines of the chunk carry its trace id: from a line to its trace.
    lines = [
        json.loads(line)
        for line in (tmp_path / "worker.log").read_text().splitlines()
        if line.startswith("{")
    ]
    [line] = [line for line in lines if line.get("event") == "chunk.applied" and line["chunk_id"] == chunk_id]
    assert line["trace_id"] == trace_id
    # The shadow's processing: a root of its own trace, linked to the chunk's, its writer the trial's.
    [shadow] = [s for s in otlp.spans if trace_id in s.links]
    assert shadow.name == "process chunk"
    assert not shadow.parent_id
    assert shadow.trace_id != trace_id
    shadow_chat = [s for s in otlp.trace(shadow.trace_id) if s.name.startswith("chat ")]
    assert [s.attributes["gen_ai.request.model"] for s in shadow_chat] == ["trial-model"]

    # Content is opt-in, per process: the worker was asked for it, the API was not.
    content_keys = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.memory.records")
    assert all("Lisbon" in call.attributes["gen_ai.input.messages"] for call in chat)
    assert "gen_ai.memory.records" in writer.attributes
    for span in otlp.spans:
        if span.service == "memstore-api":
            assert not any(key in span.attributes for key in content_keys)
            assert "Lisbon" not in repr(span.attributes)
            assert "Where does" not in repr(span.attributes)


async def test_tracing_off_stores_no_trace_context(
    api: AsyncTestClient[Litestar], tenant: TenantKeys, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    """Off (no OTEL_TRACES_EXPORTER), a client's traceparent is not kept: nothing is traced, so
    there is nothing to continue."""
    response = await api.post(
        "/v1/chunks",
        json={"user_id": "bob", "messages": [{"role": "user", "content": "hello"}]},
        headers={**tenant.admin, "traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"},
    )
    assert response.status_code == 202
    async with sessionmaker() as session:
        stored = await session.scalar(
            text("SELECT trace_parent FROM chunks WHERE id = :id"), {"id": response.json()["chunk_id"]}
        )
    assert stored is None
