"""Scope locks: Postgres session-level advisory locks, all of one worker process on one connection.

A worker holds a scope's lock while it drains the scope, writer calls included (a second or more
each). Keeping a pooled connection per scope for that long would need one Postgres connection per
call in flight — 256 calls, 256 connections per worker. Instead every lock of the process lives on
one dedicated connection, and the work borrows pooled connections only for its short transactions.

If the worker dies, Postgres drops that connection and every lock on it, so another worker takes
the scopes over at once. If the connection is lost while the worker lives, its locks are gone with
it: the epoch moves on and a scope run that took its lock in an earlier epoch stops. A connection
can also die unnoticed (its backend killed, the network cut) while the work goes on over pooled
ones, so every chunk claim checks that the lock's backend is still alive — the same backend, by pid
and start time; alive, it holds every lock this process took on it and has not released. (Asking
`pg_locks` for the lock itself would materialise every lock of the server, ~0.5 ms at a few hundred
scopes, on every claim.) A run whose claim finds it gone stops, and the connection is replaced. The
chunk claim (`attempts`, checked when applying) fences the overlap in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

_BACKEND = text("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")


def scope_lock_key(tenant_id: uuid.UUID, user_id: str) -> int:
    """A signed 64-bit advisory-lock key for a scope (a collision only serialises two scopes)."""
    digest = hashlib.blake2b(f"{tenant_id}:{user_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True)
class Lease:
    """A scope lock this process took: its key, the epoch it was taken in, the backend holding it."""

    key: int
    epoch: int
    pid: int
    backend_start: datetime | None  # with the pid, tells this backend from a later one given the same pid


class ScopeLocks:
    """The advisory locks one worker process holds, on a connection of their own."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._conn: AsyncConnection | None = None
        self._pid = 0  # the lock connection's backend, and when it started
        self._backend_start: datetime | None = None
        self._mutex = asyncio.Lock()  # one statement at a time on the shared connection
        # Advisory locks are re-entrant within a session, so the jobs of this process are told apart here.
        self._held: set[int] = set()
        self.epoch = 0

    async def try_acquire(self, key: int) -> Lease | None:
        """The lock on `key`, or None if another session (or job of this process) holds it."""
        async with self._mutex:
            if key in self._held:
                return None
            try:
                conn = await self._connection()
                locked = bool(await conn.scalar(select(func.pg_try_advisory_lock(key))))
            except BaseException:
                await self._drop()
                raise
            if not locked:
                return None
            self._held.add(key)
            return Lease(key, self.epoch, self._pid, self._backend_start)

    def holds(self, lease: Lease) -> bool:
        """Whether `lease` may still be held: its connection has not been lost as far as we know."""
        return lease.epoch == self.epoch and self._conn is not None

    async def release(self, lease: Lease) -> None:
        async with self._mutex:
            if not self.holds(lease) or lease.key not in self._held:
                return  # the lock went with the connection it lived on
            self._held.discard(lease.key)
            try:
                await (await self._connection()).scalar(select(func.pg_advisory_unlock(lease.key)))
            except BaseException:
                await self._drop()
                raise

    async def lost(self, lease: Lease) -> None:
        """`lease` was found gone: replace its connection (every lock on it is suspect)."""
        async with self._mutex:
            if self.holds(lease):
                await self._drop()

    async def aclose(self) -> None:
        """Release every lock and the connection."""
        async with self._mutex:
            await self._drop()

    async def _connection(self) -> AsyncConnection:
        if self._conn is None:
            conn = await self._engine.connect()
            self._conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            row = (await self._conn.execute(_BACKEND)).one()
            self._pid, self._backend_start = int(row.pid), row.backend_start
        return self._conn

    async def _drop(self) -> None:
        """Close the connection for good (never back to the pool holding locks); its locks go with it."""
        conn, self._conn = self._conn, None
        self._held.clear()
        self.epoch += 1
        if conn is not None:
            with contextlib.suppress(BaseException):
                await conn.invalidate()
                await conn.close()
