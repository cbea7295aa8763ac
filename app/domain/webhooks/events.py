"""What is announced, and the calls the producers make inside their own transactions.

The outbox is written in the transaction of the change it announces (nothing announced that did not
commit, nothing committed that is never announced): each producer calls `announce` with the session
of its change. An `Announcement` is one event of the producer's (`chunk.applied`, `chunk.failed`,
`review.decided`) and/or a changeset whose rows speak for themselves: every version it wrote becomes a
`memory.*` event (status `deleted` → `memory.deleted`, `superseded` → `memory.superseded`, op ADD or
SUPERSEDE → `memory.added`, UPDATE → `memory.updated`, ROLLBACK / RESTORE → `memory.restored`) and every
op it held for review a `review.held`, read by the same statement that writes the events
(`OutboxRepository.announce`): one statement per call, whatever the number of changesets.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, get_args

from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.webhooks.repositories import OutboxRepository
from app.domain.webhooks.schemas import EventType

EVENT_TYPES: tuple[str, ...] = get_args(EventType)


class ChunkLike(Protocol):
    """What an event says of a chunk (the pipeline's `ChunkRow`)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def user_id(self) -> str: ...
    @property
    def agent_id(self) -> str | None: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def seq(self) -> int: ...


def chunk_fields(chunk: ChunkLike) -> dict[str, Any]:
    """The fields every `chunk.*` event's data starts with."""
    return {
        "chunk_id": str(chunk.id),
        "user_id": chunk.user_id,
        "agent_id": chunk.agent_id,
        "run_id": chunk.run_id,
        "seq": chunk.seq,
    }


@dataclass(frozen=True)
class Announcement:
    """The events of one change of a user's: the changeset's (if any), then `type`'s (if any)."""

    tenant_id: uuid.UUID
    user_id: str
    type: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    changeset_id: uuid.UUID | None = None


async def announce(session: AsyncSession, announcements: Sequence[Announcement]) -> None:
    """Write the announcements' events to the outbox, in the caller's transaction, in this order."""
    await OutboxRepository(session).announce(
        [
            {
                "n": n,
                "tenant_id": a.tenant_id,
                "user_id": a.user_id,
                "type": a.type,
                "data": a.data,
                "changeset_id": a.changeset_id,
            }
            for n, a in enumerate(announcements)
        ]
    )


def redact(data: Any) -> Any:
    """`data` without memory contents (every `content` key, at any depth): an endpoint that did not
    opt in is told ids, never what the user said."""
    if isinstance(data, dict):
        return {k: redact(v) for k, v in data.items() if k != "content"}
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data
