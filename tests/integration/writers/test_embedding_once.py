"""A chunk of the `simple` profile, through the real API and a real worker against the fake model
server, embeds each distinct text it may store once, in one model run: the profile searches for no
candidates, so those are its memories' texts, and a text the worker embedded before (a memory said
again) is answered from the worker's cache."""

from __future__ import annotations

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from app.domain.pipeline.services import PipelineDeps
from app.embeddings import EmbedderCounts
from tests.conftest import TenantKeys
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.workers import running_worker, wait_for_chunks, wait_until

Client = AsyncTestClient[Litestar]


async def test_each_distinct_text_of_a_chunk_is_embedded_once(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    llm_settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
    fake_llm: FakeLLM,
) -> None:
    posted = 0

    async def applied(line: str) -> EmbedderCounts:
        """What the worker's embedder did for one more chunk of `line`, once it is applied."""
        nonlocal posted
        before = deps.embedder_counts
        chunk = {
            "user_id": "cy",
            "writer": "simple",
            "messages": [{"role": "user", "content": line}, {"role": "assistant", "content": "Noted."}],
        }
        response = await api.post("/v1/chunks", json=chunk, headers=ingest_headers)
        assert response.status_code == 202, response.text
        posted += 1
        assert await wait_for_chunks(sessionmaker, tenant.tenant_id, posted) == {"applied": posted}
        return deps.embedder_counts - before

    async with running_worker(llm_settings) as worker:

        async def started() -> bool:
            return "pipeline" in worker.ctx

        await wait_until(started, what="the worker's start-up")
        deps = worker.ctx["pipeline"]
        assert isinstance(deps, PipelineDeps)
        # The fake model answers "The user said: <line>": one memory, one text, one run.
        assert await applied("I like green tea.") == EmbedderCounts(runs=1, texts=1, cache_hits=0)
        # Two new memories, one twice, and one the worker embedded before (a near-duplicate, not stored).
        fake_llm.enqueue(
            Reply.json(
                {
                    "memories": [
                        "The user is a pilot.",
                        "The user flies gliders.",
                        "The user is a pilot.",
                        "The user said: I like green tea.",
                    ]
                }
            )
        )
        assert await applied("I am a pilot who flies gliders.") == EmbedderCounts(
            runs=1, texts=2, cache_hits=1
        )
        # A line said again: its memory's text is known, nothing is embedded.
        assert await applied("I like green tea.") == EmbedderCounts(runs=0, texts=0, cache_hits=1)
