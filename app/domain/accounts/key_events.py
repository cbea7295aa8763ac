"""Key changes published over Redis, so that every API process's key cache follows within milliseconds.

A revocation is published after its commit; each process's listener drops the key from its cache.
A created key is published too, so no process keeps refusing it from its cache of unknown keys.
Redis is a hint here as everywhere: a publish that fails is logged and the cache's lifetime
(`auth_cache_ttl_s`) bounds the delay; a listener that loses its connection empties its process's
cache when it is back, since it may have missed a revocation meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import structlog
from redis.exceptions import RedisError

from app.domain.accounts.auth import KeyResolver
from app.lib.pubsub import ChannelListener

log = structlog.get_logger(__name__)

CHANNEL = "memstore:keys"


class KeyEvents:
    def __init__(self, redis_url: str, resolver: KeyResolver, publish_timeout_s: float = 1.0) -> None:
        self.resolver = resolver
        self.publish_timeout_s = publish_timeout_s
        # What was revoked while the subscription was down is unknown: the cache starts afresh.
        self.listener = ChannelListener(redis_url, CHANNEL, self._apply, on_resubscribed=resolver.forget_all)

    @property
    def listening(self) -> asyncio.Event:
        """Set while subscribed (tests wait for it)."""
        return self.listener.listening

    def start(self) -> None:
        self.listener.start()

    async def aclose(self) -> None:
        await self.listener.aclose()

    async def revoked(self, key_id: uuid.UUID) -> None:
        self.resolver.forget(key_id)
        await self._publish({"revoked": str(key_id)})

    async def created(self, key_hash: str) -> None:
        self.resolver.welcome(key_hash)
        await self._publish({"created": key_hash})

    async def _publish(self, event: dict[str, str]) -> None:
        try:
            async with asyncio.timeout(self.publish_timeout_s):
                await self.listener.redis.publish(CHANNEL, json.dumps(event))
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
