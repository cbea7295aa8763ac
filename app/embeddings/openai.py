"""An OpenAI-compatible `/v1/embeddings` client (vLLM, text-embeddings-inference, any provider).

Texts go in batches of `batch_size`; each request has a timeout and is retried with jittered
exponential backoff on timeouts, connection errors, 429 (honouring `Retry-After`) and 5xx, over the
same pooled client and retry policy as the writers (`app.lib.http`). Vectors are L2-normalised here,
so cosine distance is right whatever the server returns, and a vector of the wrong dimension is an
error, never stored.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import structlog

from app.lib.http import RETRY_STATUSES, TRANSIENT_ERRORS, Endpoint, RetryPolicy

log = structlog.get_logger(__name__)


class EmbeddingError(RuntimeError):
    """The embedding endpoint gave no usable answer (after retries).

    `transient` is False when the server refused the request itself (a 4xx such as a text too long
    for the model): asking again later cannot help, so it is the input's fault, not an outage.
    """

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


def normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        return [1.0] + [0.0] * (len(vector) - 1)
    return [v / norm for v in vector]


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint; safe to share between concurrent tasks."""

    def __init__(
        self,
        base_url: str,
        model: str,
        dim: int,
        *,
        api_key: str | None = None,
        batch_size: int = 64,
        timeout_s: float = 10.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        self.model = model
        self.dim = dim
        self.name = f"openai:{model}:{dim}"
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.endpoint = Endpoint(base_url, api_key=api_key, timeout_s=timeout_s)
        self.retries = RetryPolicy(max_retries, backoff_s, backoff_max_s)

    async def aclose(self) -> None:
        await self.endpoint.aclose()

    async def embed(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(await self._embed_batch(texts[start : start + self.batch_size]))
        return vectors

    async def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        body = {"model": self.model, "input": texts, "encoding_format": "float"}
        last_error = "no attempt made"
        refused = False
        attempt = 0
        while True:
            attempt += 1
            retry_after = None
            try:
                answer = await self.endpoint.post("embeddings", body)
            except TimeoutError:
                last_error = f"TimeoutError: no answer within {self.timeout_s:g} s"
            except TRANSIENT_ERRORS as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            else:
                if answer.status == 200:
                    try:
                        payload = json.loads(answer.text)
                    except json.JSONDecodeError as exc:
                        msg = f"malformed embeddings response: {exc}"
                        raise EmbeddingError(msg) from exc
                    return self._vectors(payload, len(texts))
                last_error = f"HTTP {answer.status}: {answer.text[:200]}"
                if answer.status not in RETRY_STATUSES:
                    refused = 400 <= answer.status < 500
                    break
                retry_after = answer.retry_after
            if attempt > self.retries.max_retries:
                break
            wait = self.retries.wait_s(attempt, retry_after)
            log.info("embedder.retry", attempt=attempt, error=last_error, delay_s=round(wait, 2))
            await asyncio.sleep(wait)
        msg = f"embedding request to {self.endpoint.base_url}embeddings failed: {last_error}"
        raise EmbeddingError(msg, transient=not refused)

    def _vectors(self, payload: Any, expected: int) -> list[list[float]]:
        try:
            data = sorted(payload["data"], key=lambda item: item["index"])
            vectors = [[float(v) for v in item["embedding"]] for item in data]
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"malformed embeddings response: {exc!r}"
            raise EmbeddingError(msg) from exc
        if len(vectors) != expected:
            msg = f"asked for {expected} embeddings, got {len(vectors)}"
            raise EmbeddingError(msg)
        for vector in vectors:
            if len(vector) != self.dim:
                msg = f"model {self.model!r} returned {len(vector)} dimensions, the store holds {self.dim}"
                raise EmbeddingError(msg)
        return [normalised(v) for v in vectors]
