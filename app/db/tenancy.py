"""Which tenants' rows a database connection may see: the second wall behind the tenant predicates.

Every tenant table has a row-level security policy (migration 0008): a role that does not own the
tables — the service role the API and the workers connect as — sees and writes only rows of the
tenants named in the setting `memstore.tenant_ids` (and of their shadow banks). Without the setting,
it sees nothing. Queries still carry their own tenant predicate; the policy is what holds if one
forgets it.

The tenants of the work in progress live in a context variable (`tenant_scope`): a request's is its
key's tenant, a worker job's the scope's, a group commit's those of its batch. A pool event hands them
to the connection each time it is checked out, and Postgres gets them twice:

- **per transaction**: every BEGIN the connection sends carries `SET LOCAL memstore.tenant_ids` in
  the same simple query (`TenantConnection`), so no extra round trip. This is the copy a Citus
  cluster passes on to the shards (`citus.propagate_set_commands = 'local'`, set by `memstore db
  distribute`): a session's settings never reach them.
- **per session**, for autocommit statements, which have no BEGIN: `set_config(…, false)` on
  checkout (one round trip, skipped when the connection already carries the same tenants), written
  outside any transaction so no rollback can bring back an earlier value. On Citus this copy stays
  on the coordinator, where it serves only statements on reference tables.

Either way every statement runs with the tenants of the work that checked the connection out, never
those of the work before it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import asyncpg
from sqlalchemy import event, text
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine

# The setting the policies read, and the role the service connects as (both made by migration 0008).
TENANTS_SETTING = "memstore.tenant_ids"
SERVICE_ROLE = "memstore_service"

_TENANTS: ContextVar[tuple[uuid.UUID, ...]] = ContextVar("memstore_tenants", default=())
_SET = f"SELECT set_config('{TENANTS_SETTING}', $1, false)"
_CARRIED = "memstore_tenant_ids"  # what a pooled connection's setting holds now (its record's info)
ALIVE_AT = "memstore_alive_at"  # when a round trip last went well on a pooled connection (monotonic)


@contextlib.contextmanager
def tenant_scope(tenant_ids: Iterable[uuid.UUID]) -> Iterator[None]:
    """Connections checked out inside the block see these tenants' rows (and their shadow banks')."""
    token = _TENANTS.set(tuple(dict.fromkeys(tenant_ids)))
    try:
        yield
    finally:
        _TENANTS.reset(token)


def enter_tenant(tenant_id: uuid.UUID) -> None:
    """Make `tenant_id` the tenant of the rest of this task (a request, once its key is known)."""
    _TENANTS.set((tenant_id,))


class TenantConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg ships no types
    """An asyncpg connection whose every BEGIN also sets the tenants of the work that holds it.

    asyncpg sends BEGIN as a simple query, which may hold several statements: the transaction-local
    setting rides in the same round trip. The text still starts with BEGIN, as `pg_stat_activity` and
    statement logs show it.
    """

    tenants: str = ""  # comma-separated tenant ids, set on checkout (`_on_checkout`)

    # asyncpg's own signature, `timeout` included.
    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:  # noqa: ASYNC109
        if not args and query.startswith("BEGIN"):
            # Tenant ids are uuids, so the literal needs no escaping.
            query = f"{query.rstrip(';')} ; SET LOCAL {TENANTS_SETTING} = '{self.tenants}'"
        status: str = await super().execute(query, *args, timeout=timeout)
        return status


def install(engine: AsyncEngine) -> None:
    """Hand the current tenants to Postgres on every checkout of one of `engine`'s connections, and in
    every transaction they begin."""
    event.listen(engine.sync_engine, "do_connect", _use_tenant_connection)
    event.listen(engine.sync_engine, "checkout", _on_checkout)


def _use_tenant_connection(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
    cparams.setdefault("connection_class", TenantConnection)


async def bypasses_row_security(engine: AsyncEngine) -> bool:
    """Whether `engine` connects as the tables' owner (or a superuser), for whom the policies do not
    apply: a deployment that gives the service the owner's URL runs without this wall."""
    async with engine.connect() as conn:
        owner = await conn.scalar(
            text(
                "SELECT pg_has_role(current_user, relowner, 'MEMBER') FROM pg_class"
                " WHERE oid = to_regclass('memories')"
            )
        )
    return bool(owner)


def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    wanted = ",".join(str(t) for t in _TENANTS.get())
    connection = dbapi_connection.driver_connection
    if isinstance(connection, TenantConnection):
        connection.tenants = wanted
    if record.info.get(_CARRIED) == wanted:
        return
    record.info.pop(_CARRIED, None)
    try:
        dbapi_connection.run_async(lambda conn: conn.execute(_SET, wanted))
    except Exception as exc:
        # The pool drops this connection and checks out another, as it does for a failed pre-ping.
        raise DisconnectionError(f"could not set the tenants of a connection: {exc}") from exc
    record.info[_CARRIED] = wanted
    record.info[ALIVE_AT] = time.monotonic()  # the round trip just made: no ping needed (`app.db.engine`)
