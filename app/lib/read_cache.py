"""Values read from the database and kept a while by one process: they change rarely and may lag a little."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class ReadCache(Generic[K, V]):
    """Each value kept `ttl(value)` seconds after it was read; at most `size`, the least recently read
    dropped first."""

    ttl: Callable[[V], float]
    size: int = 4096
    # key -> (its value, when read), oldest read first
    entries: dict[K, tuple[V, float]] = field(default_factory=dict)

    async def get(self, key: K, read: Callable[[], Awaitable[V]]) -> V:
        cached = self.entries.get(key)
        if cached is not None and time.monotonic() - cached[1] < self.ttl(cached[0]):
            return cached[0]
        value = await read()
        self.entries.pop(key, None)  # re-inserted last: the most recently read
        self.entries[key] = (value, time.monotonic())
        while len(self.entries) > self.size:
            del self.entries[next(iter(self.entries))]
        return value
