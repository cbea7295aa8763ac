"""Calling model servers over HTTP: one pooled client per endpoint and process, and one retry policy.

The writers' chat completions and the embedder's `/v1/embeddings` share this: aiohttp, whose
connection pool costs the same per request at 256 connections as at 4 (httpcore's scans every
pooled connection on each request); a cap on requests in flight (a GPU server batches what it is
sent, more only queues there and times out here); and jittered exponential backoff that honours
`Retry-After`, for timeouts, connection errors, 408/409/425/429 and 5xx.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import aiohttp

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 30.0

# What a failed request raises before any answer: worth another attempt.
TRANSIENT_ERRORS = (TimeoutError, aiohttp.ClientError)


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 2
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0

    def wait_s(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based): the backoff with +-50 %
        jitter, or what the server asked for (up to 30 s) if that is longer."""
        backoff = min(self.backoff_max_s, self.backoff_s * 2.0 ** (attempt - 1))
        return max(_retry_after(retry_after), backoff * random.uniform(0.5, 1.5))  # noqa: S311  (jitter)


@dataclass(frozen=True)
class Answer:
    status: int
    text: str
    retry_after: str | None


class Endpoint:
    """A base URL with its pooled client; safe to share between the concurrent tasks of a process.

    The client belongs to the event loop that made it, so a process that runs several loops one after
    another (tests, CLI commands) gets a fresh one in each.
    """

    def __init__(
        self, base_url: str, *, api_key: str | None = None, timeout_s: float = 30.0, max_concurrency: int = 64
    ) -> None:
        self.base_url = base_url.rstrip("/") + "/"
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self._client: aiohttp.ClientSession | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None

    def _http(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._slots is None or self._client_loop is not loop:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = aiohttp.ClientSession(
                base_url=self.base_url,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=min(5.0, self.timeout_s)),
                connector=aiohttp.TCPConnector(limit=self.max_concurrency, limit_per_host=0),
                raise_for_status=False,
            )
            self._slots = asyncio.Semaphore(self.max_concurrency)
            self._client_loop = loop
        return self._client, self._slots

    def slot(self) -> asyncio.Semaphore:
        """Hold it across a request and its retries, so retries do not jump the queue."""
        return self._http()[1]

    async def post(self, path: str, body: object) -> Answer:
        """One POST of `body` as JSON, its answer read whole within the timeout; raises one of
        `TRANSIENT_ERRORS` when there is no answer."""
        client, _ = self._http()
        async with client.post(path, json=body) as response:
            text = await response.text(errors="replace")
            return Answer(response.status, text, response.headers.get("retry-after"))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _retry_after(value: str | None) -> float:
    if value is None:
        return 0.0
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(value)))
    except ValueError:
        return 0.0
