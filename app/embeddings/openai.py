"""An OpenAI-compatible `/v1/embeddings` client (vLLM, text-embeddings-inference, any provider).

Texts go in batches of `batch_size`; each request has a timeout and is retried with jittered
exponential backoff on timeouts, connection errors, 429 (honouring `Retry-After`) and 5xx. Vectors
are L2-normalised here, so cosine distance is right whatever the server returns, and a vector of
the wrong dimension is an error, never stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from typing import Any

import httpx
import structlog

log = structlog.get_logger(__name__)

_RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
_MAX_RETRY_AFTER_S = 30.0


class EmbeddingError(RuntimeError):
    """The embedding endpoint gave no usable answer (after retries)."""


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
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.dim = dim
        self.name = f"openai:{model}:{dim}"
        self.api_key = api_key
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(headers=headers, timeout=self.timeout_s)
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def embed(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(await self._embed_batch(texts[start : start + self.batch_size]))
        return vectors

    async def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        body = {"model": self.model, "input": texts, "encoding_format": "float"}
        url = f"{self.base_url}/embeddings"
        last_error = "no attempt made"
        for attempt in range(self.max_retries + 1):
            delay = min(self.backoff_max_s, self.backoff_s * 2**attempt) * random.uniform(0.8, 1.2)  # noqa: S311
            try:
                response = await self._http().post(url, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 200:
                    return self._vectors(response.json(), len(texts))
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code not in _RETRY_STATUSES:
                    break
                retry_after = response.headers.get("Retry-After")
                if retry_after is not None:
                    with contextlib.suppress(ValueError):
                        delay = min(_MAX_RETRY_AFTER_S, float(retry_after))
            if attempt < self.max_retries:
                log.info("embedder.retry", attempt=attempt + 1, error=last_error, delay_s=round(delay, 2))
                await asyncio.sleep(delay)
        msg = f"embedding request to {url} failed: {last_error}"
        raise EmbeddingError(msg)

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
