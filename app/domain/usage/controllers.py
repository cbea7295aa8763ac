"""`/v1/admin/usage`: what the tenant's writes cost, by day, user and writer."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import QueryParameter
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.usage import services
from app.domain.usage.schemas import UsageReport
from app.lib.errors import InvalidField, error_responses
from app.lib.params import Limit


class UsageController(Controller):
    path = "/v1/admin/usage"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @get(
        "/",
        summary="What the tenant's writes cost: chunks, model calls, tokens, embedded texts",
        responses=error_responses(InvalidField),
    )
    async def usage(
        self,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        since: Annotated[
            date | None, QueryParameter(description="First UTC day (default: 6 days ago).")
        ] = None,
        until: Annotated[date | None, QueryParameter(description="Last UTC day (default: today).")] = None,
        group_by: Annotated[
            list[Literal["day", "user", "writer"]] | None,
            QueryParameter(description="Any of day, user, writer (default: day and writer).", max_items=3),
        ] = None,
        limit: Limit = 100,
    ) -> UsageReport:
        return await services.tenant_report(
            db_session,
            caller.tenant_id,
            since=since,
            until=until,
            group_by=["day", "writer"] if group_by is None else group_by,
            limit=limit,
        )
