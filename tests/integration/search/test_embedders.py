"""The OpenAI-compatible embedder against a model server speaking real HTTP: batching, order,
normalisation, retries, timeouts, and refusing vectors of the wrong dimension."""

from __future__ import annotations

import math

import pytest

from app.config import Settings
from app.embeddings import HashingEmbedder, embedder_from_settings
from app.embeddings.openai import EmbeddingError, OpenAIEmbedder
from tests.support.fake_llm import FakeLLM, Reply


async def test_batches_keep_order_and_come_back_normalised() -> None:
    texts = [f"The user owns {i} bicycles and a red kayak number {i * 7}." for i in range(150)]
    async with FakeLLM() as server:
        embedder = embedder_from_settings(
            Settings(embedder="openai", embedder_base_url=server.base_url, embedder_batch_size=64)
        )
        assert isinstance(embedder.inner, OpenAIEmbedder)
        vectors = await embedder.embed(texts)
        assert [len(r["input"]) for r in server.embedding_requests] == [64, 64, 22]
        assert server.embedding_requests[0]["model"] == "all-MiniLM-L6-v2"
    expected = await HashingEmbedder(384).embed(texts)
    assert len(vectors) == 150
    for got, want in zip(vectors, expected, strict=True):
        assert math.isclose(math.fsum(v * v for v in got), 1.0, rel_tol=1e-9)
        assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(got, want, strict=True))
    assert embedder.name == "openai:all-MiniLM-L6-v2:384"


async def test_retries_5xx_and_429_then_succeeds() -> None:
    async with FakeLLM() as server:
        server.embedding_script.extend(
            [Reply(status=503), Reply(status=429, headers={"Retry-After": "0"}), Reply(status=500)]
        )
        embedder = OpenAIEmbedder(server.base_url, "m", 384, max_retries=3, backoff_s=0.01)
        [vector] = await embedder.embed(["The user lives in Lyon."])
        assert len(server.embedding_requests) == 4
    assert vector == pytest.approx(HashingEmbedder(384).embed_one("The user lives in Lyon."))


async def test_gives_up_after_retries_and_on_client_errors() -> None:
    async with FakeLLM() as server:
        server.embedding_script.extend([Reply(status=500)] * 3)
        embedder = OpenAIEmbedder(server.base_url, "m", 384, max_retries=2, backoff_s=0.01)
        with pytest.raises(EmbeddingError, match="HTTP 500"):
            await embedder.embed(["x"])
        assert len(server.embedding_requests) == 3

        server.embedding_requests.clear()
        server.embedding_script.append(Reply(status=400, body=b'{"error": {"message": "bad model"}}'))
        with pytest.raises(EmbeddingError, match="HTTP 400"):
            await embedder.embed(["x"])
        assert len(server.embedding_requests) == 1  # a client error is not retried


async def test_a_slow_server_times_out() -> None:
    async with FakeLLM() as server:
        server.embedding_script.append(Reply(delay_s=1.0))
        embedder = OpenAIEmbedder(server.base_url, "m", 384, timeout_s=0.1, max_retries=0)
        with pytest.raises(EmbeddingError, match="Timeout"):
            await embedder.embed(["x"])


async def test_vectors_of_another_dimension_are_refused() -> None:
    async with FakeLLM() as server:
        server.embedding_dim = 768
        embedder = OpenAIEmbedder(server.base_url, "big-model", 384)
        with pytest.raises(EmbeddingError, match="768 dimensions"):
            await embedder.embed(["x"])


def test_unknown_embedder_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown embedder 'word2vec'"):
        embedder_from_settings(Settings(embedder="word2vec"))
