"""`/admin`: the console page; `/v1/admin/users`, `/v1/admin/changesets/counts`, `/v1/admin/chunks`: the
admin reads it browses by (any admin client may use them).

The page is static (HTML, CSS and JavaScript shipped in the package, no build step, nothing rendered
from data on the server). It holds the admin key in page memory only and sends it as a bearer key,
like any API client, so it adds no cookie and no second way in: every call it makes passes the same
authentication, role guards and rate limits. Its responses forbid framing and any script, style or
connection that is not the API's own origin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from litestar import Controller, Response, get
from litestar.di import NamedDependency
from litestar.params import QueryParameter
from litestar.static_files import create_static_files_router
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.console.schemas import ChangesetCount, ChangesetCounts, UserList, UserOut
from app.domain.history.repositories import HistoryRepository
from app.domain.ingest.repositories import ChunkRepository, ScopeRepository
from app.domain.ingest.schemas import ChunkList, ChunkStatus
from app.domain.ingest.services import progress_in
from app.domain.memories.repositories import MemoryRepository
from app.lib.errors import InvalidField, error_responses
from app.lib.paging import KeysetCursor, UserCursor, decode_keyset, keyset_cursor, paged
from app.lib.params import Limit, Text, When

STATIC_DIR = Path(__file__).with_name("static")
CONSOLE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def console_router() -> Any:
    """The console's files under /admin (`/admin/` is its page), outside the API's OpenAPI document."""
    return create_static_files_router(
        path="/admin",
        directories=[STATIC_DIR],
        html_mode=True,
        name="console",
        include_in_schema=False,
        after_request=_console_headers,
    )


async def _console_headers(response: Response[Any]) -> Response[Any]:
    response.headers.update(CONSOLE_HEADERS)
    return response


class ConsoleReadsController(Controller):
    path = "/v1/admin"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @get(
        "/users",
        summary="The tenant's users, by user id, with their chunk and active memory counts",
    )
    async def list_users(
        self,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        prefix: Annotated[str | None, QueryParameter(max_length=200)] = None,
        limit: Limit = 50,
        cursor: UserCursor = None,
    ) -> UserList:
        tenant_id = caller.tenant_id
        page = await paged(
            lambda n: ScopeRepository(db_session).page(tenant_id, prefix=prefix, after=cursor, limit=n),
            limit,
            lambda scope: scope.user_id,
        )
        active = await MemoryRepository(db_session).count_active(tenant_id, [s.user_id for s in page.items])
        items = [UserOut(s.user_id, s.last_seq, active.get(s.user_id, 0), s.created_at) for s in page.items]
        return UserList(items=items, next_cursor=page.next_cursor)

    @get("/changesets/counts", summary="Changesets counted by kind, writer, model and status")
    async def changeset_counts(
        self,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        user_id: Text = None,
        since: When = None,
        until: When = None,
    ) -> ChangesetCounts:
        rows = await HistoryRepository(db_session).changeset_counts(
            caller.tenant_id, user_id=user_id, since=since, until=until
        )
        return ChangesetCounts(items=[ChangesetCount(**row) for row in rows])

    @get(
        "/chunks",
        summary="Chunks in a status (failed by default, or all), newest first, with their messages",
        responses=error_responses(InvalidField),
    )
    async def list_chunks(
        self,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        status: Annotated[
            Literal["failed", "queued", "processing", "applied", "all"], QueryParameter()
        ] = "failed",
        user_id: Text = None,
        limit: Limit = 50,
        cursor: KeysetCursor = None,
    ) -> ChunkList:
        before = decode_keyset(cursor) if cursor else None
        page = await paged(
            lambda n: ChunkRepository(db_session).page_by_status(
                caller.tenant_id, None if status == "all" else status, user_id=user_id, before=before, limit=n
            ),
            limit,
            lambda chunk: keyset_cursor(chunk.received_at, chunk.id),
        )
        found = await progress_in(db_session, caller.tenant_id, page.items)
        return ChunkList(
            items=[
                ChunkStatus.of(c, may_read=True, progress=p) for c, p in zip(page.items, found, strict=True)
            ],
            next_cursor=page.next_cursor,
        )
