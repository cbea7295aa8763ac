"""`POST /v1/memories/search`: the best memories for a query, in a scope or across the tenant."""

from __future__ import annotations

from litestar import Controller, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.memories.schemas import MemoryOut
from app.domain.search.repositories import Hit
from app.domain.search.schemas import SearchIn, SearchOut, SearchResult
from app.domain.search.services import Searcher, SearchQuery
from app.lib.errors import AsOfTooBroad, EmbedderMismatch, InvalidField, Unavailable, error_responses


def _result(hit: Hit) -> SearchResult:
    return SearchResult(memory=MemoryOut.of(hit), score=hit.score, similarity=hit.similarity)


class SearchController(Controller):
    path = "/v1/memories/search"
    tags = ["memories"]
    guards = [requires_role("read")]

    @post(
        "/",
        status_code=HTTP_200_OK,
        summary="The memories that best match a query, best first",
        responses=error_responses(InvalidField, AsOfTooBroad, EmbedderMismatch, Unavailable),
    )
    async def search(
        self,
        data: JSONBody[SearchIn],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        searcher: NamedDependency[Searcher],
    ) -> SearchOut:
        query = SearchQuery(
            query=data.query,
            user_id=data.user_id,
            top_k=data.top_k,
            threshold=data.threshold,
            as_of=data.as_of,
            agent_id=data.agent_id,
            tags=tuple(data.tags),
            mode=data.mode,
            all_users=data.all_users,
            include_expired=data.include_expired,
            valid_at=data.valid_at,
            reference_time=data.reference_time,
        )
        hits = await searcher.search(db_session, caller.tenant_id, query)
        return SearchOut(results=[_result(h) for h in hits])
