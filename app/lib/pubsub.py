"""One Redis channel listened to for as long as a process runs, through lost connections.

The API processes follow what other processes announce this way (key changes, finished chunks). Redis
is a hint everywhere it is used: while the subscription is down, messages are missed, and each
listener says what it does about that when it is back (`on_resubscribed`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

_RETRY_S = (0.1, 0.5, 1.0, 2.0)


class ChannelListener:
    """`handle(data)` for each message on `channel`, from `start()` to `aclose()`; `listening` is set
    while subscribed (tests wait for it)."""

    def __init__(
        self,
        redis_url: str,
        channel: str,
        handle: Callable[[bytes | str], None],
        *,
        on_resubscribed: Callable[[], None] | None = None,
    ) -> None:
        self.redis: Redis = Redis.from_url(redis_url, socket_connect_timeout=0.5, socket_timeout=None)
        self.channel = channel
        self.handle = handle
        self.on_resubscribed = on_resubscribed
        self.listening = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name=f"listen:{self.channel}")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.redis.aclose()

    async def _listen(self) -> None:
        failures = 0
        while True:
            try:
                async with self.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(self.channel)
                    if failures:
                        if self.on_resubscribed is not None:
                            self.on_resubscribed()
                        log.info("pubsub.listening_again", channel=self.channel, after_failures=failures)
                    failures = 0
                    self.listening.set()
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self.handle(message["data"])
                    raise ConnectionError("the subscription ended")
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                self.listening.clear()
                if failures == 0:
                    log.warning("pubsub.listener_lost", channel=self.channel, error=type(exc).__name__)
                await asyncio.sleep(_RETRY_S[min(failures, len(_RETRY_S) - 1)])
                failures += 1
