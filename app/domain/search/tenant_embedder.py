"""A tenant's own embedder, and moving a tenant to another one while every other tenant goes on.

A deployment embeds with `MEMSTORE_EMBEDDER`; a tenant may choose another of `MEMSTORE_TENANT_EMBEDDERS`
(`embedder` in `PATCH /v1/admin/settings`): a multilingual model for a tenant whose users write in
several languages, beside English tenants on the default. The choice lives in `tenants.settings`:

- `embedder`: the tenant's own embedder (absent: the deployment's);
- `embedder_switch`: a move under way, `{"to": name, "since": time, "cursor": memory id or null}`;
- `embedder_changed_at`: when the last move finished (version rows keep the vectors they were written
  with: an undo that brings an older text back embeds it again, `HistoryRepository.stale_vectors`).

Vectors of two embedders are never compared: a tenant's searches, its writer's candidates, the
near-duplicate rule and the floors each take the tenant's embedder (`Searcher.embedder_for`,
`PipelineDeps.embedder_of`); every statement that compares vectors names one tenant. The HNSW graph is
one index over every tenant's rows; a search through it keeps the tenant's rows alone.

A move (`switch_tenant`, run by a worker's job that the settings' change enqueues, or by `memstore
reembed --tenant`) re-embeds the tenant's memories alone, in batches that each commit, so it resumes
where it stopped. Meanwhile its searches answer 409 `embedder_mismatch`, and its chunks wait, queued,
their attempts uncounted (the pipeline reads the move with the tenant's options); a memory written or
edited through the API meanwhile is embedded by the new embedder (`Searcher.tenant_embedder`), which
compares no vectors. The walk starts only when every process has seen the move
(`MEMSTORE_EMBEDDER_SWITCH_SETTLE_S`, past the processes' copies of tenants' options) and no chunk of
the tenant is being processed: from then on nothing writes a vector of the old embedder for the tenant.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from arq.connections import ArqRedis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Chunk, Tenant
from app.db.tenancy import tenant_scope
from app.domain.audit.services import record_event
from app.domain.search.reembedding import next_batch, reembed_batch
from app.embeddings import Embedders
from app.lib.errors import EmbedderMismatch
from app.lib.queue import QUEUE_NAME
from app.lib.read_cache import ReadCache

log = structlog.get_logger(__name__)

OWN = "embedder"
SWITCH = "embedder_switch"
CHANGED_AT = "embedder_changed_at"

# Tenants' options are kept by each process for up to 30 s (`TenantOptionsCache`, `EmbedderChoices`); a
# move waits longer than that after it was asked for (`MEMSTORE_EMBEDDER_SWITCH_SETTLE_S`, 35 s), so
# that every process has read it before it starts.
CACHE_TTL_S = 30.0
# A tenant found moving is read again this soon, so that its searches answer once the move is done.
SWITCHING_TTL_S = 1.0
SWITCH_JOB = "switch_embedder"


@dataclass(frozen=True)
class TenantEmbedder:
    """The tenant's own embedder (None: the deployment's), and the one it is moving to, if any."""

    own: str | None = None
    switching_to: str | None = None

    def name(self, default: str) -> str:
        return self.own or default

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> TenantEmbedder:
        own, switch = settings.get(OWN), settings.get(SWITCH)
        to = switch.get("to") if isinstance(switch, dict) else None
        return cls(str(own) if own else None, str(to) if to else None)


def refuse_while_switching(choice: TenantEmbedder) -> None:
    """A tenant moving to another embedder has vectors of two: nothing may compare them meanwhile."""
    if choice.switching_to is not None:
        msg = (
            f"this tenant's memories are being re-embedded with {choice.switching_to!r}; searches answer "
            "again when that is done"
        )
        raise EmbedderMismatch(msg, details={"switching_to": choice.switching_to})


async def read_choice(session: AsyncSession, tenant_id: uuid.UUID) -> TenantEmbedder:
    """The tenant's embedder choice, read now (one statement)."""
    row = (
        await session.execute(
            select(Tenant.settings[OWN].astext, Tenant.settings[SWITCH]["to"].astext).where(
                Tenant.id == tenant_id
            )
        )
    ).first()
    if row is None:
        return TenantEmbedder()
    return TenantEmbedder(row[0] or None, row[1] or None)


@dataclass
class EmbedderChoices:
    """Tenants' embedder choices, read from Postgres and kept `ttl_s` (they change rarely; a move waits
    until every process's copy has expired); a tenant found moving is read again within a second, so
    that its end is seen at once. At most `size` tenants."""

    size: int = 4096
    ttl_s: float = CACHE_TTL_S
    cache: ReadCache[uuid.UUID, TenantEmbedder] = field(init=False)

    def __post_init__(self) -> None:
        self.cache = ReadCache(self._ttl, self.size)

    def _ttl(self, choice: TenantEmbedder) -> float:
        return SWITCHING_TTL_S if choice.switching_to else self.ttl_s

    async def get(self, session: AsyncSession, tenant_id: uuid.UUID) -> TenantEmbedder:
        return await self.cache.get(tenant_id, lambda: read_choice(session, tenant_id))


def allowed_embedders(default: str, tenant_embedders: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([default, *tenant_embedders]))


async def ask_switch(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    to: str,
    *,
    default: str,
    actor: str,
    request_id: str | None = None,
) -> str | None:
    """Record that the tenant moves to embedder `to` (in the caller's transaction, audited): the move's
    key (when it was asked for), or None when the tenant already uses `to` and no move is under way.
    Asking again for the move under way changes nothing (the same key); asking for another one while a
    move is under way starts over with that one."""
    tenant = await session.get(Tenant, tenant_id, with_for_update=True)
    if tenant is None:
        return None
    choice = TenantEmbedder.of(tenant.settings)
    if choice.switching_to == to:
        return str(tenant.settings[SWITCH]["since"])
    if choice.switching_to is None and choice.name(default) == to:
        return None
    switch = {"to": to, "since": datetime.now(UTC).isoformat(), "cursor": None}
    # Its shadow banks move with it: a bank's memories are compared with the tenant's.
    for moving in (tenant, *await _banks(session, tenant_id, lock=True)):
        moving.settings = {**moving.settings, SWITCH: switch}
    await session.flush()
    await record_event(
        session,
        tenant_id=tenant_id,
        actor=actor,
        action="tenant.embedder_set",
        target_type="tenant",
        target_id=str(tenant_id),
        summary={"embedder": to, "was": choice.name(default)},
        request_id=request_id,
    )
    return switch["since"]


async def enqueue_switch(
    redis: ArqRedis, tenant_id: uuid.UUID, move: str | None = None, *, defer_s: float | None = None
) -> None:
    """Have a worker carry on the tenant's move (`switch_tenant`), after `defer_s` if given. Asked for the
    move `move` (its key, `ask_switch`), once: asked twice, the second is dropped while the first is
    queued or running; a run that stops before the end enqueues the next (`move` None: a job of its own,
    which takes up whatever move is under way)."""
    job_id = f"{SWITCH_JOB}:{tenant_id}:{move or uuid.uuid4().hex}"
    await redis.enqueue_job(
        SWITCH_JOB, str(tenant_id), _job_id=job_id, _queue_name=QUEUE_NAME, _defer_by=defer_s
    )


@dataclass
class SwitchOutcome:
    to: str | None  # None: no move was under way
    embedded: int  # memories re-embedded by this run
    finished: bool


async def switch_tenant(
    sessionmaker: async_sessionmaker[AsyncSession],
    embedders: Embedders,
    tenant_id: uuid.UUID,
    *,
    actor: str,
    batch_size: int = 256,
    settle_s: float | None = None,
    budget_s: float | None = None,
    poll_s: float = 0.5,
) -> SwitchOutcome:
    """Carry on the tenant's move to another embedder: wait until it has settled, then re-embed its
    memories from where the last run stopped, a batch per transaction, until done (the move recorded
    as finished) or `budget_s` has passed (a later run goes on). It settles for `settle_s` (default:
    the deployment's `embedder_switch_settle_s`) after the move was asked for."""
    started = time.monotonic()
    if settle_s is None:
        settle_s = embedders.settings.embedder_switch_settle_s
    with tenant_scope([tenant_id]):  # the tenant and its shadow banks
        async with sessionmaker() as session:
            switch = await _switch(session, tenant_id)
            banks = [bank.id for bank in await _banks(session, tenant_id)]
        if switch is None:
            return SwitchOutcome(None, 0, finished=True)
        to = str(switch["to"])
        since = datetime.fromisoformat(str(switch["since"]))
        embedder = embedders.get(to)
        # Until every process has read the move, and no chunk of the tenant's is in a writer's hands.
        while True:
            async with sessionmaker() as session:
                now = await session.scalar(select(func.now()))
                busy = await session.scalar(
                    select(func.count())
                    .select_from(Chunk)
                    .where(Chunk.tenant_id.in_([tenant_id, *banks]), Chunk.status == "processing")
                )
            assert now is not None
            if now >= since + timedelta(seconds=settle_s) and not busy:
                break
            if budget_s is not None and time.monotonic() - started > budget_s:
                return SwitchOutcome(to, 0, finished=False)
            wait = (since + timedelta(seconds=settle_s) - now).total_seconds()
            await asyncio.sleep(max(poll_s, min(wait, 5.0)))  # time itself must pass
        embedded = 0
        default = embedders.settings.embedder
        # Its banks first, each finished as its walk ends (a later run passes it over), the tenant last.
        for walked in (*banks, tenant_id):
            async with sessionmaker() as session:
                own = await _switch(session, walked)
            if own is None or own["to"] != to:
                continue
            cursor = uuid.UUID(str(own["cursor"])) if own.get("cursor") else None
            while True:
                async with sessionmaker() as session:
                    rows = await next_batch(session, walked, cursor, batch_size)
                if not rows:
                    break
                cursor = next(reversed(rows))

                async def move_cursor(
                    session: AsyncSession, t: uuid.UUID = walked, c: uuid.UUID = cursor
                ) -> None:
                    await _set_cursor(session, t, to, c)

                await reembed_batch(sessionmaker, embedder, walked, rows, move_cursor)
                embedded += len(rows)
                if budget_s is not None and time.monotonic() - started > budget_s:
                    return SwitchOutcome(to, embedded, finished=False)
            async with sessionmaker() as session, session.begin():
                done = await _finish(
                    session, walked, to, default=default, actor=actor, audit=walked == tenant_id
                )
    log.info("embedder.switched", tenant_id=str(tenant_id), embedder=to, embedded=embedded, done=done)
    return SwitchOutcome(to, embedded, finished=done)


async def _banks(session: AsyncSession, tenant_id: uuid.UUID, *, lock: bool = False) -> list[Tenant]:
    """The tenant's shadow banks (`shadows`): hidden tenants whose memories are compared with its own."""
    query = select(Tenant).where(Tenant.shadow_of == tenant_id).order_by(Tenant.id)
    return list((await session.scalars(query.with_for_update() if lock else query)).all())


async def _switch(session: AsyncSession, tenant_id: uuid.UUID) -> dict[str, Any] | None:
    switch = await session.scalar(select(Tenant.settings[SWITCH]).where(Tenant.id == tenant_id))
    return switch if isinstance(switch, dict) and switch.get("to") else None


async def _set_cursor(session: AsyncSession, tenant_id: uuid.UUID, to: str, cursor: uuid.UUID) -> None:
    """Move the run's cursor, if the move under way is still the one to `to`."""
    tenant = await session.get(Tenant, tenant_id, with_for_update=True)
    if tenant is None:
        return
    switch = tenant.settings.get(SWITCH)
    if isinstance(switch, dict) and switch.get("to") == to:
        tenant.settings = {**tenant.settings, SWITCH: {**switch, "cursor": str(cursor)}}
        await session.flush()


async def _finish(
    session: AsyncSession, tenant_id: uuid.UUID, to: str, *, default: str, actor: str, audit: bool = True
) -> bool:
    """Record the move as done, if it is still the one to `to` (another asked meanwhile starts over);
    audited for a tenant (a shadow bank's is part of its tenant's move)."""
    tenant = await session.get(Tenant, tenant_id, with_for_update=True)
    if tenant is None:
        return False
    switch = tenant.settings.get(SWITCH)
    if not (isinstance(switch, dict) and switch.get("to") == to):
        return False
    kept = {k: v for k, v in tenant.settings.items() if k not in (SWITCH, OWN)}
    own = {} if to == default else {OWN: to}
    tenant.settings = {**kept, **own, CHANGED_AT: datetime.now(UTC).isoformat()}
    await session.flush()
    if not audit:
        return True
    await record_event(
        session,
        tenant_id=tenant_id,
        actor=actor,
        action="tenant.embedder_switched",
        target_type="tenant",
        target_id=str(tenant_id),
        summary={"embedder": to},
    )
    return True
