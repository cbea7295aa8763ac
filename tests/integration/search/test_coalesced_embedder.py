"""The embedder every process shares (`CoalescedEmbedder`): concurrent calls share one model run (one
request to an embeddings server), a failure reaches each waiting caller, a cancelled caller costs
nothing, a bound on a run's texts holds, and a text embedded once is answered from the cache, with the
very vector the model gives."""

from __future__ import annotations

import asyncio

import pytest

from app.config import Settings
from app.embeddings import CoalescedEmbedder, EmbedderCounts, HashingEmbedder, embedder_from_settings
from app.embeddings.openai import EmbeddingError, OpenAIEmbedder
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.semantic import semantic_embedder
from tests.support.waiting import wait_for


def served(server: FakeLLM, **options: int) -> CoalescedEmbedder:
    """The openai embedder against the fake server, as `embedder_from_settings` builds it."""
    settings = Settings(embedder="openai", embedder_base_url=server.base_url, embedder_max_retries=0)
    embedder = embedder_from_settings(settings)
    for name, value in options.items():
        setattr(embedder, name, value)
    return embedder


async def test_concurrent_callers_share_one_request() -> None:
    texts = [f"The user keeps item {i} in drawer {i * 3}." for i in range(40)]
    async with FakeLLM() as server:
        embedder = served(server)
        answers = await asyncio.gather(*(embedder.embed([t]) for t in texts))
        assert len(server.embedding_requests) == 1
        assert server.embedding_requests[0]["input"] == texts
        assert embedder.counts == EmbedderCounts(runs=1, texts=40, cache_hits=0)
        # Each caller got its own text's vector, the one a call of its own gets.
        alone = OpenAIEmbedder(server.base_url, "all-MiniLM-L6-v2", 384)
        assert [a for [a] in answers] == await alone.embed(texts)
        await alone.aclose()
        await embedder.aclose()


async def test_a_text_two_callers_wait_for_is_embedded_once() -> None:
    async with FakeLLM() as server:
        embedder = served(server)
        first, second = await asyncio.gather(
            embedder.embed(["Lyon", "Paris", "Lyon"]), embedder.embed(["Paris", "Oslo"])
        )
        assert server.embedding_requests[0]["input"] == ["Lyon", "Paris", "Oslo"]
        assert first[0] == first[2]
        assert first[1] == second[0]
        assert embedder.counts == EmbedderCounts(runs=1, texts=3, cache_hits=0)
        await embedder.aclose()


async def test_a_failure_reaches_every_caller_of_the_run_and_the_next_run_works() -> None:
    async with FakeLLM() as server:
        embedder = served(server)
        server.embedding_script.append(Reply(status=400, body=b'{"error": {"message": "too long"}}'))
        outcomes = await asyncio.gather(
            *(embedder.embed([f"text {i}"]) for i in range(5)), return_exceptions=True
        )
        assert len(server.embedding_requests) == 1
        assert all(isinstance(o, EmbeddingError) and "HTTP 400" in str(o) for o in outcomes)
        # Nothing of the failed run was kept: the texts are embedded when asked again.
        [vector] = await embedder.embed(["text 0"])
        assert len(vector) == 384
        assert embedder.counts == EmbedderCounts(runs=2, texts=6, cache_hits=0)
        await embedder.aclose()


async def test_a_cancelled_caller_is_skipped() -> None:
    async with FakeLLM() as server:
        embedder = served(server)
        with server.held_embeddings() as arrived:
            running = asyncio.create_task(embedder.embed(["in the run"]))
            await asyncio.to_thread(arrived.wait, 5)
            # Queued behind the run under way: cancelled before its turn, its text is never sent.
            queued = asyncio.create_task(embedder.embed(["never embedded"]))
            await wait_for(
                lambda: [w.texts for w in embedder._queue],
                lambda texts: ["never embedded"] in texts,
                timeout_s=5,
                what="the caller queued behind the run",
            )
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
        [vector] = await running
        assert len(vector) == 384
        assert [r["input"] for r in server.embedding_requests] == [["in the run"]]

        # A caller cancelled while its run is under way: the others of the run still get their rows.
        with server.held_embeddings() as arrived:
            leaving = asyncio.create_task(embedder.embed(["leaves"]))
            staying = asyncio.create_task(embedder.embed(["stays"]))
            await asyncio.to_thread(arrived.wait, 5)
            leaving.cancel()
        [kept] = await staying
        assert len(kept) == 384
        assert leaving.cancelled()
        assert embedder.counts == EmbedderCounts(runs=2, texts=3, cache_hits=0)
        await embedder.aclose()


async def test_a_run_takes_at_most_max_batch_texts() -> None:
    async with FakeLLM() as server:
        embedder = served(server, max_batch=4)
        await asyncio.gather(*(embedder.embed([f"a{i}", f"b{i}", f"c{i}"]) for i in range(3)))
        assert [len(r["input"]) for r in server.embedding_requests] == [3, 3, 3]
        # One call above the bound still runs, alone.
        await embedder.embed([f"long {i}" for i in range(10)])
        assert [len(r["input"]) for r in server.embedding_requests][3:] == [10]
        assert embedder.runs == 4
        await embedder.aclose()


async def test_closing_fails_the_waiting_callers_and_closes_the_client() -> None:
    async with FakeLLM() as server:
        embedder = served(server)
        inner = embedder.inner
        assert isinstance(inner, OpenAIEmbedder)
        with server.held_embeddings() as arrived:
            waiting = asyncio.create_task(embedder.embed(["waits"]))
            await asyncio.to_thread(arrived.wait, 5)
            await embedder.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await waiting


async def test_a_cached_vector_is_the_one_the_model_gives() -> None:
    model = semantic_embedder().inner
    embedder = CoalescedEmbedder(model)
    text = "The user moved to Seattle in March."
    [first] = await embedder.embed([text])
    [again, _other] = await embedder.embed([text, "The user has a cat."])
    assert embedder.counts == EmbedderCounts(runs=2, texts=2, cache_hits=1)
    [fresh] = await model.embed([text])
    assert first == again == fresh  # exactly, float for float

    hashing = CoalescedEmbedder(HashingEmbedder(384))
    await hashing.embed([text])
    assert await hashing.embed([text]) == [HashingEmbedder(384).embed_one(text)]
    assert hashing.counts == EmbedderCounts(runs=1, texts=1, cache_hits=1)


async def test_the_cache_keeps_the_most_recently_used_texts() -> None:
    embedder = CoalescedEmbedder(HashingEmbedder(384), cache_size=2)
    for text in ("a cat", "a dog", "a cat", "a fox"):  # "a dog" is the least recently used: dropped
        await embedder.embed([text])
    assert embedder.counts == EmbedderCounts(runs=3, texts=3, cache_hits=1)
    await embedder.embed(["a cat"])
    assert embedder.counts.cache_hits == 2
    await embedder.embed(["a dog"])
    assert embedder.counts == EmbedderCounts(runs=4, texts=4, cache_hits=2)

    off = CoalescedEmbedder(HashingEmbedder(384), cache_size=0)
    await off.embed(["a cat"])
    await off.embed(["a cat"])
    assert off.counts == EmbedderCounts(runs=2, texts=2, cache_hits=0)


def test_every_configured_embedder_is_coalesced_and_keeps_its_name() -> None:
    embedder = embedder_from_settings(Settings(embedder="hashing", embedder_cache_size=7))
    assert isinstance(embedder.inner, HashingEmbedder)
    assert (embedder.name, embedder.dim, embedder.cache_size) == ("hashing-v2-384", 384, 7)
