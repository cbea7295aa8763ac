"""Key changes published over Redis, so that every API process's key cache follows within milliseconds.

A revocation is published after its commit; each process's listener drops the key from its cache.
A created key is published too, so no process keeps refusing it from its cache of unknown keys.
Redis is a hint here as everywhere: a publish that fails is logged and the cache's lifetime
(`auth_cache_ttl_s`) bounds the delay; a listener that loses its connection empties its process's
cache when it is back, since it may have missed a revocation meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.domain.accounts.auth import KeyResolver

log = structlog.get_logger(__name__)

CHANNEL = "memstore:keys"
_RETRY_S = (0.1, 0.5, 1.0, 2.0)


class KeyEvents:
    def __init__(self, redis_url: str, resolver: KeyResolver, publish_timeout_s: float = 1.0) -> None:
        self.resolver = resolver
        self.publish_timeout_s = publish_timeout_s
        self._redis: Redis = Redis.from_url(redis_url, socket_connect_timeout=0.5, socket_timeout=None)
        self.listening = asyncio.Event()  # set while subscribed (tests wait for it)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="memstore-key-events")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._redis.aclose()

    async def revoked(self, key_id: uuid.UUID) -> None:
        self.resolver.forget(key_id)
        await self._publish({"revoked": str(key_id)})

    async def created(self, key_hash: str) -> None:
        self.resolver.welcome(key_hash)
        await self._publish({"created": key_hash})

    async def _publish(self, event: dict[str, str]) -> None:
        try:
            async with asyncio.timeout(self.publish_timeout_s):
                await self._redis.publish(CHANNEL, json.dumps(event))
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("keys.publish_failed", change=event, error=type(exc).__name__)

    def _apply(self, data: bytes | str) -> None:
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if isinstance(revoked := event.get("revoked"), str):
            self.resolver.forget(revoked)
        if isinstance(created := event.get("created"), str):
            self.resolver.welcome(created)

    async def _listen(self) -> None:
        failures = 0
        while True:
            try:
                async with self._redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    if failures:
                        self.resolver.forget_all()  # what was revoked while we were away
                        log.info("keys.listening_again", after_failures=failures)
                    failures = 0
                    self.listening.set()
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self._apply(message["data"])
                    raise ConnectionError("the subscription ended")
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                self.listening.clear()
                if failures == 0:
                    log.warning("keys.listener_lost", error=type(exc).__name__)
                await asyncio.sleep(_RETRY_S[min(failures, len(_RETRY_S) - 1)])
                failures += 1
