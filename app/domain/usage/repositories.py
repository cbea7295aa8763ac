"""The usage report's one statement: writer changesets summed by the groups asked for."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import BigInteger, Date, cast, func, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Changeset, Tenant
from app.domain.usage.schemas import UsageRow

GROUPS = ("day", "user", "writer")


def _count(key: str) -> Any:
    return func.coalesce(func.sum(cast(Changeset.usage[key].astext, BigInteger)), 0)


class UsageRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def tenant_names(self, tenant_ids: set[uuid.UUID]) -> dict[str, str]:
        if not tenant_ids:
            return {}
        rows = await self.session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(tenant_ids)))
        return {str(tenant_id): name for tenant_id, name in rows}

    async def report(
        self,
        tenant_id: uuid.UUID | None,
        since: date,
        until: date,
        group_by: Sequence[str],
        limit: int,
    ) -> list[UsageRow]:
        """The tenant's writer changesets from `since` to `until` (UTC days, inclusive) summed by
        `group_by` (of `GROUPS`, and by tenant when `tenant_id` is None: the operator's, across tenants,
        as the tables' owner), most tokens first, at most `limit` groups."""
        day = cast(func.timezone("UTC", Changeset.created_at), Date)
        keys: dict[str, Any] = {
            "day": day if "day" in group_by else literal(None, Date),
            "user": Changeset.user_id if "user" in group_by else literal(None),
            "writer": Changeset.writer if "writer" in group_by else literal(None),
            "tenant": Changeset.tenant_id if tenant_id is None else literal(None),
        }
        tokens = _count("prompt_tokens") + _count("completion_tokens")
        grouped = [keys[g] for g in (*group_by, *(["tenant"] if tenant_id is None else []))]
        statement = (
            select(
                keys["day"],
                keys["user"],
                keys["writer"],
                keys["tenant"],
                func.count(),
                _count("calls"),
                _count("prompt_tokens"),
                _count("completion_tokens"),
                _count("embedder_texts"),
            )
            .where(
                Changeset.kind == "writer",
                Changeset.created_at >= datetime.combine(since, time(), UTC),
                Changeset.created_at < datetime.combine(until + timedelta(days=1), time(), UTC),
            )
            .order_by(tokens.desc(), *grouped)
            .limit(limit)
        )
        if tenant_id is not None:
            statement = statement.where(Changeset.tenant_id == tenant_id)
        if grouped:
            statement = statement.group_by(*grouped)
        rows = await self.session.execute(statement)
        return [
            UsageRow(
                day=r[0],
                user_id=r[1],
                writer=r[2],
                tenant_id=r[3],
                chunks_applied=int(r[4]),
                model_calls=int(r[5]),
                prompt_tokens=int(r[6]),
                completion_tokens=int(r[7]),
                embedder_texts=int(r[8]),
            )
            for r in rows
        ]
