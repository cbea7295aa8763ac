"""Counting what a hot path asks of Postgres and Redis, at the client libraries' boundaries.

Nothing here stands in for Memstore's code: the counters watch real traffic on its way out.

- `PostgresLedger` counts, for one SQLAlchemy engine, (a) the statements SQLAlchemy executes
  (`before_cursor_execute`) and (b) every round trip asyncpg makes on the engine's connections: a
  statement's prepare (Parse/Describe, when the connection has not prepared that text yet) and its
  execution, BEGIN / COMMIT / ROLLBACK, the pool's pre-ping (asyncpg's `;`) and the tenancy
  `set_config` on checkout — the last two SQLAlchemy's statement events never see. It wraps each
  asyncpg connection's protocol object in a counting proxy, on the pool's `connect` / `checkout`.
- `RedisLedger` counts the round trips one redis-py connection pool makes: one per
  `send_packed_command` (a pipeline is one), named by its commands. The pool's connection upkeep is
  kept apart, in `upkeep`: what a connection sends in its `on_connect` (the handshake of a new or
  re-opened connection: HELLO, AUTH, CLIENT SETNAME / SETINFO, SELECT) and in its `check_health`
  (the PING before a command on a connection idle longer than `health_check_interval`). That traffic
  comes from the connection's history (how long it sat idle, whether it was dropped), not from what
  the request asks, so it is no part of a budget; a caller that sees it measures again, since upkeep
  on every request (a connection per request) is a regression of its own.

Labels are short and stable ("execute INSERT INTO chunks", "pipeline[EVAL, PUBLISH]") so a budget
is a `Counter` of them and a failure says which round trip appeared or went.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from redis.asyncio import ConnectionPool
from redis.asyncio.connection import AbstractConnection
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

# asyncpg protocol calls that each cost one round trip (a message sequence ended by Sync, or a
# simple query), and how a call is labelled.
_ROUND_TRIPS = {
    "prepare": "prepare",
    "bind_execute": "execute",
    "bind_execute_many": "execute many",
    "bind": "bind",
    "execute": "execute portal",
    "query": "query",
    "close_statement": "close statement",
    "close_portal": "close portal",
    "copy_in": "copy in",
    "copy_out": "copy out",
}
_TABLE = r"\"?(?!lateral\b)([a-z_][a-z0-9_]*)\"?"
_WRITES = (
    (re.compile(rf"^INSERT INTO {_TABLE}", re.IGNORECASE), "INSERT INTO {}"),
    (re.compile(rf"^UPDATE {_TABLE}", re.IGNORECASE), "UPDATE {}"),
    (re.compile(rf"^DELETE FROM {_TABLE}", re.IGNORECASE), "DELETE FROM {}"),
)
_FROM = re.compile(rf"\b(?:FROM|JOIN(?: LATERAL)?) {_TABLE}", re.IGNORECASE)
_CALL = re.compile(r"^SELECT ([a-z_][a-z0-9_]*)\(", re.IGNORECASE)


def statement_label(sql: str) -> str:
    """A statement's verb and table: `INSERT INTO chunks`, `SELECT FROM memories, memory_versions`
    (the tables read, in order), `SELECT pg_try_advisory_lock`, `BEGIN`."""
    text = " ".join(sql.split()).rstrip(";").strip() or ";"
    for pattern, form in _WRITES:
        if m := pattern.match(text):
            return form.format(m.group(1))
    verb = text.split(" ", 1)[0].upper() if text else "(empty)"
    if verb in {"SELECT", "WITH"}:
        if tables := list(dict.fromkeys(_FROM.findall(text))):
            return f"{verb} FROM {', '.join(tables)}"
        if m := _CALL.match(text):
            return f"SELECT {m.group(1)}"
    return text[:40] if verb not in {"BEGIN", "COMMIT", "ROLLBACK"} else verb


class _CountingProtocol:
    """asyncpg's protocol object, each round trip it makes recorded first (everything else passed on)."""

    def __init__(self, protocol: Any, record: Callable[[str], None]) -> None:
        object.__setattr__(self, "_real", protocol)
        object.__setattr__(self, "_record", record)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._real, name)
        kind = _ROUND_TRIPS.get(name)
        if kind is None:
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._record(f"{kind} {_what(name, args, kwargs)}".rstrip())
            return attribute(*args, **kwargs)

        return counted

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._real, name, value)


def _what(call: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    if call == "query":  # simple protocol: BEGIN, COMMIT, ROLLBACK
        return statement_label(str(kwargs.get("query", args[0] if args else "")))
    if call == "prepare":  # (name, query, ...)
        return statement_label(str(kwargs.get("query", args[1] if len(args) > 1 else "")))
    state = kwargs.get("state", args[0] if args else None)  # a prepared statement's state
    return statement_label(str(getattr(state, "query", "")))


class PostgresLedger:
    """Statements and wire round trips of one engine's connections, since the last `reset`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine.sync_engine
        self.statements: list[str] = []  # as SQLAlchemy executes them
        self.wire: list[str] = []  # as asyncpg sends them
        event.listen(self.engine, "before_cursor_execute", self._on_statement)
        event.listen(self.engine, "connect", self._watch)
        event.listen(self.engine, "checkout", self._on_checkout)

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._on_statement)
        event.remove(self.engine, "connect", self._watch)
        event.remove(self.engine, "checkout", self._on_checkout)

    def reset(self) -> None:
        self.statements.clear()
        self.wire.clear()

    def _on_statement(self, *args: Any) -> None:
        _conn, _cursor, statement, _parameters, _context, executemany = args
        self.statements.append(statement_label(statement) + (" (executemany)" if executemany else ""))

    def _on_checkout(self, dbapi_connection: Any, *_: Any) -> None:
        self._watch(dbapi_connection)

    def _watch(self, dbapi_connection: Any, *_: Any) -> None:
        connection = dbapi_connection._connection  # the asyncpg connection under SQLAlchemy's adapter
        if not isinstance(connection._protocol, _CountingProtocol):
            connection._protocol = _CountingProtocol(connection._protocol, self.wire.append)

    def transactions(self) -> int:
        """Transactions begun on the wire (a pre-ping's BEGIN / ROLLBACK pair included)."""
        return self.wire.count("query BEGIN")


# The methods `RedisLedger` wraps on each connection of its pool (as the instance's attributes).
_WRAPPED = ("send_packed_command", "on_connect", "check_health")


class RedisLedger:
    """Round trips of one redis-py connection pool, since the last `reset`: one per packed send, named
    by its commands (`EVALSHA`, `pipeline[EVAL, PUBLISH]`), in `round_trips`; the connections'
    upkeep (handshakes in `on_connect`, health-check PINGs in `check_health`) in `upkeep`."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.round_trips: list[str] = []
        self.upkeep: list[str] = []
        self.pool = pool
        self._watched: list[AbstractConnection] = []
        self._make = pool.make_connection
        for connection in [*pool._available_connections, *pool._in_use_connections]:
            self._watch(connection)
        pool.make_connection = self._make_connection  # type: ignore[method-assign]

    def close(self) -> None:
        self.pool.make_connection = self._make  # type: ignore[method-assign]
        for connection in self._watched:  # the class's methods again
            for name in _WRAPPED:
                vars(connection).pop(name, None)
        self._watched.clear()

    def reset(self) -> None:
        self.round_trips.clear()
        self.upkeep.clear()

    def idle(self) -> bool:
        """No connection of the pool is in use (every reply read)."""
        return not self.pool._in_use_connections

    def _make_connection(self) -> AbstractConnection:
        connection: AbstractConnection = self._make()  # type: ignore[no-untyped-call]
        self._watch(connection)
        return connection

    def _watch(self, connection: AbstractConnection) -> None:
        if connection.redis_connect_func is not None:  # `connect` would call it instead of on_connect
            msg = "RedisLedger: a connection with a redis_connect_func handshakes where it cannot see"
            raise NotImplementedError(msg)
        send = connection.send_packed_command
        on_connect = connection.on_connect
        health_check = connection.check_health
        upkeep = 0  # how deep this connection is in its on_connect / check_health (they nest)

        async def counted(command: Any, check_health: bool = True) -> None:
            (self.upkeep if upkeep else self.round_trips).append(redis_label(command))
            await send(command, check_health)

        async def connecting() -> None:
            nonlocal upkeep
            upkeep += 1
            try:
                await on_connect()
            finally:
                upkeep -= 1

        async def checking_health() -> None:
            nonlocal upkeep
            upkeep += 1
            try:
                await health_check()  # type: ignore[no-untyped-call]
            finally:
                upkeep -= 1

        # redis-py's asyncio `AbstractConnection.connect` calls `self.on_connect()` and its
        # `send_packed_command` calls `self.check_health()`: looked up on the instance, so these.
        connection.send_packed_command = counted  # type: ignore[method-assign]
        connection.on_connect = connecting  # type: ignore[method-assign]
        connection.check_health = checking_health  # type: ignore[method-assign]
        self._watched.append(connection)


def redis_commands(packed: bytes) -> list[str]:
    """The command names in RESP-encoded requests (one, or a pipeline's)."""
    names: list[str] = []
    at = 0
    while at < len(packed) and packed[at : at + 1] == b"*":
        end = packed.index(b"\r\n", at)
        count = int(packed[at + 1 : end])
        at = end + 2
        for i in range(count):
            end = packed.index(b"\r\n", at)
            size = int(packed[at + 1 : end])
            if i == 0:
                names.append(packed[end + 2 : end + 2 + size].decode().upper())
            at = end + 2 + size + 2
    return names


def redis_label(command: Any) -> str:
    if isinstance(command, str):
        command = command.encode()
    packed = command if isinstance(command, bytes) else b"".join(bytes(part) for part in command)
    names = redis_commands(packed)
    return names[0] if len(names) == 1 else f"pipeline[{', '.join(names)}]"


def budget_diff(what: str, counted: Iterable[str], budget: Mapping[str, int]) -> str:
    """A failure message: the counts against the budget, what was added and what went, in order seen."""
    seen = list(counted)
    have = Counter(seen)
    added = have - Counter(budget)
    removed = Counter(budget) - have
    return (
        f"{what}: {sum(have.values())} against a budget of {sum(budget.values())}\n"
        f"  added (not in the budget): {dict(added)}\n"
        f"  gone (in the budget, not seen): {dict(removed)}\n"
        f"  in order: {seen}"
    )
