"""The webhook tables' SQL: endpoints, the outbox (`OutboxRepository.announce`, one statement whatever
the number of events) and deliveries (claimed in per-user order, their attempts recorded)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Integer, Text, and_, bindparam, func, literal, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.arrays import as_columns
from app.db.distribution import session_is_distributed
from app.db.models import WebhookDelivery, WebhookEndpoint, WebhookEvent

# The outbox in one statement (see `OutboxRepository.announce`). Items of tenants without an enabled
# endpoint are dropped first, so a tenant without webhooks pays this one round trip and no more.
# Each item's events, in order: the versions its changeset wrote (by version row), the reviews it held,
# then its own event. The INSERT's rows come sorted, so `seq` follows that order. On a Citus cluster:
# the tenants' enabled endpoints are read once (`hook`, a query of their shards), as a correlated
# subquery over `unnest` cannot be pushed down; the versions and reviews joined to the items name the
# batch's tenants as values too (`= ANY`), as a join to `unnest` prunes no shard (every shard of both was
# read); the deliveries' INSERT returns its ids, so it is written by INSERT on the shards, not by COPY,
# which row-level security refuses. Its INSERT … SELECT from the other CTEs still reaches every node:
# on a cluster it runs only for tenants with an enabled endpoint (`OutboxRepository.announce`).
_ANNOUNCE = text(
    """
    WITH hook AS MATERIALIZED (
        SELECT w.id, w.tenant_id, w.event_types FROM webhook_endpoints w
        WHERE w.tenant_id = ANY (:tenant_id) AND w.enabled
    ), item AS (
        SELECT i.* FROM unnest(:n, :tenant_id, :user_id, :type, :data, :changeset_id)
            AS i(n, tenant_id, user_id, type, data, changeset_id)
        WHERE i.tenant_id IN (SELECT h.tenant_id FROM hook h)
    ), src AS (
        SELECT i.n, 0 AS k, v.id AS sub, v.tenant_id, v.user_id::text AS user_id,
               CASE WHEN v.status = 'deleted' THEN 'memory.deleted'
                    WHEN v.status = 'superseded' THEN 'memory.superseded'
                    WHEN v.op IN ('ADD', 'SUPERSEDE') THEN 'memory.added'
                    WHEN v.op = 'UPDATE' THEN 'memory.updated'
                    ELSE 'memory.restored' END AS type,
               jsonb_build_object(
                   'memory_id', v.memory_id, 'version', v.version, 'op', v.op, 'status', v.status,
                   'user_id', v.user_id, 'changeset_id', v.changeset_id, 'chunk_id', v.chunk_id,
                   'writer', v.writer, 'model', v.model, 'profile', v.profile, 'actor', v.actor,
                   'reason', v.reason, 'tags', to_jsonb(v.tags), 'supersedes', to_jsonb(v.supersedes),
                   'superseded_by', v.superseded_by, 'content', v.content
               ) AS data
        FROM item i JOIN memory_versions v ON v.changeset_id = i.changeset_id AND v.tenant_id = i.tenant_id
        WHERE v.tenant_id = ANY (:tenant_id)
        UNION ALL
        SELECT i.n, 1, r.op_index, r.tenant_id, r.user_id::text, 'review.held',
               jsonb_build_object(
                   'review_id', r.id, 'user_id', r.user_id, 'agent_id', r.agent_id, 'run_id', r.run_id,
                   'changeset_id', r.changeset_id, 'chunk_id', r.chunk_id, 'op', r.op, 'targets', r.targets,
                   'writer', r.writer, 'model', r.model, 'profile', r.profile
               )
        FROM item i JOIN reviews r
            ON r.tenant_id = i.tenant_id AND r.status = 'pending' AND r.changeset_id = i.changeset_id
        WHERE r.tenant_id = ANY (:tenant_id)
        UNION ALL
        SELECT i.n, 2, 0, i.tenant_id, i.user_id, i.type, i.data::jsonb FROM item i WHERE i.type IS NOT NULL
    ), event AS (
        INSERT INTO webhook_events (tenant_id, user_id, type, data)
        SELECT s.tenant_id, s.user_id, s.type, s.data FROM src s
        WHERE EXISTS (
            SELECT 1 FROM hook h
            WHERE h.tenant_id = s.tenant_id
              AND (cardinality(h.event_types) = 0 OR s.type = ANY (h.event_types))
        )
        ORDER BY s.n, s.k, s.sub
        RETURNING id, seq, tenant_id, user_id, type
    )
    INSERT INTO webhook_deliveries (tenant_id, endpoint_id, event_id, event_seq, user_id)
    SELECT e.tenant_id, h.id, e.id, e.seq, e.user_id
    FROM event e JOIN hook h
        ON h.tenant_id = e.tenant_id AND (cardinality(h.event_types) = 0 OR e.type = ANY (h.event_types))
    RETURNING id
    """
).bindparams(
    bindparam("n", type_=ARRAY(Integer)),
    bindparam("tenant_id", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("user_id", type_=ARRAY(Text)),
    bindparam("type", type_=ARRAY(Text)),
    bindparam("data", type_=ARRAY(Text)),
    bindparam("changeset_id", type_=ARRAY(UUID(as_uuid=True))),
)

# The tenants of a batch with an enabled endpoint, named as values (`= ANY`): one query of their shards.
_HOOKED = (
    select(WebhookEndpoint.tenant_id)
    .where(
        WebhookEndpoint.tenant_id == func.any(bindparam("tenant_ids", type_=ARRAY(UUID(as_uuid=True)))),
        WebhookEndpoint.enabled,
    )
    .distinct()
)

# The due heads of the tenant's (endpoint, user) queues, claimed: a lease (`next_attempt_at` moved past
# the attempt's timeout) and the attempt counted, so a worker that dies mid-attempt leaves the delivery
# to be retried when the lease ends. A queue's later deliveries wait while its head is pending: a user's
# events reach an endpoint in order. A disabled endpoint's queue waits until it is enabled again. Every
# table is named with the tenant as a value: on a Citus cluster the row lock is allowed only on a
# statement that reaches one shard, which a subquery correlated to another row's tenant does not.
_CLAIM = text(
    """
    WITH due AS (
        SELECT d.id FROM webhook_deliveries d
        WHERE d.tenant_id = :tenant_id AND d.status = 'pending' AND d.next_attempt_at <= now()
          AND EXISTS (
              SELECT 1 FROM webhook_endpoints w
              WHERE w.tenant_id = :tenant_id AND w.id = d.endpoint_id AND w.enabled
          )
          AND NOT EXISTS (
              SELECT 1 FROM webhook_deliveries p
              WHERE p.tenant_id = :tenant_id AND p.endpoint_id = d.endpoint_id AND p.user_id = d.user_id
                AND p.event_seq < d.event_seq AND p.status = 'pending'
          )
        ORDER BY d.next_attempt_at, d.event_seq
        LIMIT :limit
        FOR UPDATE OF d SKIP LOCKED
    )
    UPDATE webhook_deliveries d
    SET attempts = d.attempts + 1, last_attempt_at = now(),
        next_attempt_at = now() + make_interval(secs => :lease_s)
    FROM due WHERE d.tenant_id = :tenant_id AND d.id = due.id
    RETURNING d.id, d.endpoint_id, d.event_id, d.attempts
    """
)


# A delivery's event, joined on the tenant as well: on a Citus cluster a join on the id alone is not
# co-located (refused), and an UPDATE by id alone reaches every shard.
_EVENT_OF_DELIVERY = and_(
    WebhookEvent.tenant_id == WebhookDelivery.tenant_id, WebhookEvent.id == WebhookDelivery.event_id
)


@dataclass(frozen=True)
class Claimed:
    """A delivery taken for one attempt, with what it needs to be sent."""

    id: uuid.UUID
    attempts: int
    endpoint: WebhookEndpoint
    event: WebhookEvent


class EndpointRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def add(self, endpoint: WebhookEndpoint) -> WebhookEndpoint:
        self.session.add(endpoint)
        await self.session.flush()
        return endpoint

    async def get(self, tenant_id: uuid.UUID, endpoint_id: uuid.UUID) -> WebhookEndpoint | None:
        return await self.session.scalar(
            select(WebhookEndpoint).where(
                WebhookEndpoint.tenant_id == tenant_id, WebhookEndpoint.id == endpoint_id
            )
        )

    async def list(self, tenant_id: uuid.UUID) -> Sequence[WebhookEndpoint]:
        rows = await self.session.scalars(
            select(WebhookEndpoint)
            .where(WebhookEndpoint.tenant_id == tenant_id)
            .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
        )
        return rows.all()

    async def remove(self, endpoint: WebhookEndpoint) -> None:
        """The endpoint and its deliveries, through `memstore_delete_webhook` (migration 0015): the
        service role deletes nothing itself."""
        await self.session.execute(select(func.memstore_delete_webhook(endpoint.id)))
        self.session.expunge(endpoint)


class OutboxRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def announce(self, items: Sequence[dict[str, Any]]) -> None:
        """Write the events of `items` (`events.Announcement.row()`), and a pending delivery for each
        endpoint that wants one, in the caller's transaction: one statement."""
        if not items:
            return
        if await session_is_distributed(self.session):
            # On a Citus cluster the outbox statement (its INSERT … SELECT from the other CTEs) reaches
            # every node, whatever its tenants: run it only for tenants with an enabled endpoint, found
            # first on their own shards, so the applies and edits of the others go on while a worker
            # is down. One Postgres: one statement as before.
            tenant_ids = sorted({item["tenant_id"] for item in items})
            hooked = set(await self.session.scalars(_HOOKED, {"tenant_ids": tenant_ids}))
            items = [item for item in items if item["tenant_id"] in hooked]
            if not items:
                return
        columns = as_columns(
            items, ("n", "tenant_id", "user_id", "type", "data", "changeset_id"), json=("data",)
        )
        await self.session.execute(_ANNOUNCE, columns)


class DeliveryRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def due_tenants(self, limit: int) -> list[uuid.UUID]:
        """Tenants with deliveries due (a SECURITY DEFINER function: migration 0015)."""
        rows = await self.session.scalars(
            select(func.memstore_webhook_due_tenants(limit, type_=UUID(as_uuid=True)))
        )
        return list(rows)

    async def claim(self, tenant_id: uuid.UUID, limit: int, lease_s: float) -> list[Claimed]:
        rows = (
            await self.session.execute(_CLAIM, {"tenant_id": tenant_id, "limit": limit, "lease_s": lease_s})
        ).all()
        if not rows:
            return []
        endpoints = {
            e.id: e
            for e in await self.session.scalars(
                select(WebhookEndpoint).where(
                    WebhookEndpoint.tenant_id == tenant_id,
                    WebhookEndpoint.id.in_({r.endpoint_id for r in rows}),
                )
            )
        }
        events = {
            e.id: e
            for e in await self.session.scalars(
                select(WebhookEvent).where(
                    WebhookEvent.tenant_id == tenant_id, WebhookEvent.id.in_({r.event_id for r in rows})
                )
            )
        }
        return [
            Claimed(r.id, r.attempts, endpoints[r.endpoint_id], events[r.event_id])
            for r in sorted(rows, key=lambda r: events[r.event_id].seq)
        ]

    async def record(
        self,
        tenant_id: uuid.UUID,
        delivery_id: uuid.UUID,
        *,
        attempt: dict[str, Any],
        delivered: bool,
        retry_in_s: float | None,
        response_status: int | None,
        error: str | None,
    ) -> None:
        """The outcome of an attempt: delivered; retried in `retry_in_s`; or (None) given up."""
        values: dict[str, Any] = {
            "log": WebhookDelivery.log.op("||")(literal([attempt], JSONB)),
            "response_status": response_status,
            "last_error": error,
        }
        if delivered:
            values |= {"status": "delivered", "delivered_at": func.now()}
        elif retry_in_s is None:
            values |= {"status": "failed"}
        else:
            values |= {"next_attempt_at": func.now() + timedelta(seconds=retry_in_s)}
        await self.session.execute(
            update(WebhookDelivery)
            .where(
                WebhookDelivery.tenant_id == tenant_id,
                WebhookDelivery.id == delivery_id,
                WebhookDelivery.status == "pending",
            )
            .values(**values)
        )

    async def list(
        self,
        tenant_id: uuid.UUID,
        endpoint_id: uuid.UUID,
        *,
        status: str | None,
        limit: int,
        before_seq: int | None = None,
    ) -> Sequence[tuple[WebhookDelivery, WebhookEvent]]:
        """The endpoint's deliveries, newest event first."""
        stmt = (
            select(WebhookDelivery, WebhookEvent)
            .join(WebhookEvent, _EVENT_OF_DELIVERY)
            .where(WebhookDelivery.tenant_id == tenant_id, WebhookDelivery.endpoint_id == endpoint_id)
            .order_by(WebhookDelivery.event_seq.desc(), WebhookDelivery.id)
            .limit(limit)
        )
        if status is not None:
            stmt = stmt.where(WebhookDelivery.status == status)
        if before_seq is not None:
            stmt = stmt.where(WebhookDelivery.event_seq < before_seq)
        return [(d, e) for d, e in (await self.session.execute(stmt)).all()]

    async def get(
        self, tenant_id: uuid.UUID, endpoint_id: uuid.UUID, delivery_id: uuid.UUID
    ) -> tuple[WebhookDelivery, WebhookEvent] | None:
        row = (
            await self.session.execute(
                select(WebhookDelivery, WebhookEvent)
                .join(WebhookEvent, _EVENT_OF_DELIVERY)
                .where(
                    WebhookDelivery.tenant_id == tenant_id,
                    WebhookDelivery.endpoint_id == endpoint_id,
                    WebhookDelivery.id == delivery_id,
                )
                .with_for_update(of=WebhookDelivery)
            )
        ).first()
        return None if row is None else (row[0], row[1])

    async def redeliver(self, tenant_id: uuid.UUID, delivery_id: uuid.UUID) -> None:
        """Pending again, due now, with a fresh retry schedule; its log keeps the earlier attempts."""
        await self.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.tenant_id == tenant_id, WebhookDelivery.id == delivery_id)
            .values(status="pending", attempts=0, next_attempt_at=func.now(), delivered_at=None)
        )
