"""Read-your-writes: a chunk's finish (applied, or failed for good) announced over Redis, so that a
client's `GET /v1/chunks/{id}?wait=S` answers at once instead of polling.

The workers announce the chunks they finish, many in one PUBLISH: a chunk is put in the announcer's
buffer when its apply has committed, and a flusher publishes whatever gathered by the time it runs
(the chunks of one group commit go together). Nothing waits for it on the chunk's path.

Each API process holds one subscription (`FinishedChunks`) and a future per waiting request; a
request registers its future before it reads the chunk, so a finish between the read and the wait
is not missed. Redis is a hint here as everywhere: an announcement lost (Redis away, a process
subscribing late) only makes a waiting request answer at the end of its wait, with the chunk's
status as Postgres has it then.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import uuid
from collections.abc import Iterator

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.lib.pubsub import ChannelListener

log = structlog.get_logger(__name__)

CHANNEL = "memstore:chunks:finished"


class ChunkAnnouncer:
    """A worker's side: `finished(chunk_id)` after the commit; one PUBLISH a flush (ids as text, space
    separated)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._buffer: list[uuid.UUID] = []
        self._flusher: asyncio.Task[None] | None = None

    def finished(self, chunk_id: uuid.UUID) -> None:
        self._buffer.append(chunk_id)
        if self._flusher is None or self._flusher.done():
            # In a context of its own: a flush is no one job's.
            self._flusher = asyncio.create_task(self._flush(), context=contextvars.Context())

    async def _flush(self) -> None:
        while self._buffer:
            await asyncio.sleep(0)  # the chunks finished in this same turn go in the same message
            ids, self._buffer = self._buffer, []
            try:
                await self.redis.publish(CHANNEL, " ".join(str(i) for i in ids))
            except (RedisError, OSError) as exc:
                log.warning("chunks.announce_failed", chunks=len(ids), error=type(exc).__name__)

    async def aclose(self) -> None:
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await self._flusher


class FinishedChunks:
    """An API process's side: one subscription, and the requests waiting for chunks to finish."""

    def __init__(self, redis_url: str) -> None:
        self._waiting: dict[uuid.UUID, set[asyncio.Future[None]]] = {}
        self.listener = ChannelListener(redis_url, CHANNEL, self._announced)

    @property
    def listening(self) -> asyncio.Event:
        """Set while subscribed (tests wait for it)."""
        return self.listener.listening

    def start(self) -> None:
        self.listener.start()

    async def aclose(self) -> None:
        await self.listener.aclose()

    @property
    def waiting(self) -> int:
        """Requests waiting now (for tests and the curious)."""
        return sum(len(futures) for futures in self._waiting.values())

    @contextlib.contextmanager
    def watching(self, chunk_ids: list[uuid.UUID]) -> Iterator[asyncio.Future[None]]:
        """A future done when every one of `chunk_ids` is announced finished; registered on entry (before
        the caller reads their status), withdrawn on exit."""
        loop = asyncio.get_running_loop()
        left = set(chunk_ids)
        whole: asyncio.Future[None] = loop.create_future()
        futures: dict[uuid.UUID, asyncio.Future[None]] = {}

        def one_done(chunk_id: uuid.UUID, _: asyncio.Future[None]) -> None:
            left.discard(chunk_id)
            if not left and not whole.done():
                whole.set_result(None)

        for chunk_id in left.copy():
            future: asyncio.Future[None] = loop.create_future()
            future.add_done_callback(functools.partial(one_done, chunk_id))
            futures[chunk_id] = future
            self._waiting.setdefault(chunk_id, set()).add(future)
        try:
            yield whole
        finally:
            for chunk_id, future in futures.items():
                waiting = self._waiting.get(chunk_id)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiting[chunk_id]
                future.cancel()

    def _announced(self, data: bytes | str) -> None:
        if not self._waiting:
            return
        text = data.decode() if isinstance(data, bytes) else data
        for word in text.split():
            try:
                chunk_id = uuid.UUID(word)
            except ValueError:
                continue
            for future in self._waiting.pop(chunk_id, ()):
                if not future.done():
                    future.set_result(None)
