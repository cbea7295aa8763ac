"""Shadow banks: a writer on trial writes a tenant's chunks into a bank of its own.

A bank is a tenant whose `shadow_of` names the tenant it shadows. It receives copies of that tenant's
chunks (each keyed by its source chunk's id) and the ordinary pipeline writes them with the bank's
writer: in `seq` order per user, versioned, guarded and audited like any bank, with its candidates
drawn from its own memories, so it evolves as if that writer were the primary. Because it is another
tenant, nothing that reads a tenant's memories (lists, search, history, exports) can see it; it has
no API keys. Its chunks fail, retry and back off on their own, and a worker drains at most
`MEMSTORE_SHADOW_MAX_JOBS` banks at once in slots of their own, so a slow or failing shadow never takes
a slot, an attempt or a transaction from the primary.

Two kinds: a **live** bank (named after its writer) is fed each new chunk of the tenant from the moment
the shadow was named (`shadow_writers` setting) as a worker takes up the chunk's scope; a **replay** bank
is fed once with the stored chunks a filter selects (user, time window), so a writer is tried on past
traffic. Feeding is idempotent: a replay started again adds nothing and waits for what is left.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.domain.pipeline.repositories import PipelineRepository
from app.domain.shadows.repositories import Progress, ShadowRepository
from app.lib.errors import BankConflict, BankNotFound

LIVE = "live"
REPLAY = "replay"
PRIMARY = "primary"  # how comparisons name the tenant's own bank
_FEED_BATCH = 2_000


@dataclass(frozen=True)
class Bank:
    """A shadow bank of a tenant."""

    id: uuid.UUID
    parent_id: uuid.UUID
    name: str  # unique within the tenant: the writer's name for a live bank
    writer: str
    kind: str  # live | replay
    since: datetime
    until: datetime | None = None
    user_id: str | None = None
    created_at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "writer": self.writer,
            "kind": self.kind,
            "since": self.since.isoformat(),
            "until": self.until.isoformat() if self.until else None,
            "user_id": self.user_id,
        }

    @classmethod
    def of(cls, row_id: uuid.UUID, parent_id: uuid.UUID, shadow: dict[str, Any]) -> Bank:
        until = shadow.get("until")
        return cls(
            id=row_id,
            parent_id=parent_id,
            name=str(shadow["name"]),
            writer=str(shadow["writer"]),
            kind=str(shadow["kind"]),
            since=datetime.fromisoformat(shadow["since"]),
            until=datetime.fromisoformat(until) if until else None,
            user_id=shadow.get("user_id"),
        )


def _tenant_name(parent_id: uuid.UUID, bank: str) -> str:
    return f"shadow:{parent_id}:{bank}"


def replay_bank_name(writer: str, user_id: str | None, since: datetime | None, until: datetime | None) -> str:
    """The bank a replay writes into, the same for the same writer and filter, so running it again
    resumes it."""
    key = "|".join(
        [writer, user_id or "", since.isoformat() if since else "", until.isoformat() if until else ""]
    )
    return f"replay-{writer}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


async def banks(session: AsyncSession, tenant_id: uuid.UUID) -> list[Bank]:
    """The tenant's shadow banks, by name."""
    return [Bank.of(r.id, tenant_id, r.shadow) for r in await ShadowRepository(session).banks(tenant_id)]


async def bank(session: AsyncSession, tenant_id: uuid.UUID, name: str) -> Bank:
    """The tenant's bank called `name`; 404 when it has none."""
    for found in await banks(session, tenant_id):
        if found.name == name:
            return found
    raise BankNotFound(f"No shadow bank {name!r}.", details={"bank": name})


async def ensure_bank(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    name: str,
    writer: str,
    kind: str,
    since: datetime | None = None,
    until: datetime | None = None,
    user_id: str | None = None,
) -> Bank:
    """The bank called `name`, created if the tenant has none (a bank, once made, keeps what it is)."""
    wanted = Bank(
        id=uuid.uuid4(),
        parent_id=tenant_id,
        name=name,
        writer=writer,
        kind=kind,
        since=since or datetime.now(UTC),
        until=until,
        user_id=user_id,
    )
    repo = ShadowRepository(session)
    await repo.ensure(tenant_id, _tenant_name(tenant_id, name), wanted.as_json())
    found = await bank(session, tenant_id, name)
    if (found.writer, found.kind) != (writer, kind):
        raise BankConflict(
            f"Bank {name!r} exists with writer {found.writer!r} ({found.kind}).",
            details={"bank": name, "writer": found.writer, "kind": found.kind},
        )
    return found


async def feed(
    session: AsyncSession, target: Bank, *, user_id: str | None = None, limit: int = _FEED_BATCH
) -> list[str]:
    """Copy the tenant's chunks that `target` selects and has not had yet into it (at most `limit`);
    the users of the copied chunks, one per chunk. Feeding again adds nothing twice."""
    if target.user_id is not None and user_id is not None and user_id != target.user_id:
        return []
    return await PipelineRepository(session).feed_bank(
        bank_id=target.id,
        source_id=target.parent_id,
        writer=target.writer,
        since=target.since,
        until=target.until,
        user_id=user_id or target.user_id,
        limit=limit,
    )


async def progress(session: AsyncSession, target: Bank, user_id: str | None = None) -> Progress:
    return await ShadowRepository(session).progress(target.id, user_id)


class LiveFeeder:
    """Feeds a tenant's live banks each time a worker takes up one of its scopes (one per process).

    The banks are created at the first chunk after a shadow writer is named, and remembered."""

    _CACHE_SIZE = 4096

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._banks: dict[tuple[uuid.UUID, str], Bank] = {}

    async def feed_scope(
        self,
        tenant_id: uuid.UUID,
        user_id: str,
        writers: tuple[str, ...],
        named: Mapping[str, str] | None = None,
    ) -> list[Bank]:
        """Copy the scope's new chunks into the live bank of each of `writers`; the banks that got any.

        A new bank receives the chunks received since its writer was named (`named`, from the tenant's
        settings); a writer named by the deployment, those since the oldest chunk of the scope still
        unfinished, so the chunk that brought the worker here is the bank's first."""
        fed: list[Bank] = []
        made: list[Bank] = []
        async with AsyncSession(self.engine) as session, session.begin():
            for writer in writers:
                target = self._banks.get((tenant_id, writer))
                if target is None:
                    when = (named or {}).get(writer)
                    since = (
                        datetime.fromisoformat(when)
                        if when
                        else await ShadowRepository(session).oldest_unfinished(tenant_id, user_id)
                    )
                    target = await ensure_bank(
                        session, tenant_id, name=writer, writer=writer, kind=LIVE, since=since
                    )
                    made.append(target)
                if await feed(session, target, user_id=user_id):
                    fed.append(target)
        # Remembered once committed: another job of this process must not use a bank row it cannot see.
        for target in made:
            if len(self._banks) >= self._CACHE_SIZE:
                self._banks.clear()
            self._banks[(tenant_id, target.writer)] = target
        return fed
