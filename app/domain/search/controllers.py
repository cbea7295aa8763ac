"""`POST /v1/memories/search`: the best memories for a query, in a scope or across the tenant."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.status_codes import HTTP_200_OK
from sqlalchemy.ext.asyncio import AsyncSession

from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Principal
from app.domain.memories.schemas import MemoryOut
from app.domain.search.repositories import Hit
from app.domain.search.schemas import SearchIn, SearchOut, SearchResult
from app.domain.search.services import Searcher, SearchQuery


def _result(hit: Hit) -> SearchResult:
    return SearchResult(memory=MemoryOut.of(hit), score=hit.score, similarity=hit.similarity)


class SearchController(Controller):
    path = "/v1/memories/search"
    tags = ["memories"]
    guards = [requires_role("read")]

    @post("/", status_code=HTTP_200_OK, summary="The memories that best match a query, best first")
    async def search(
        self,
        data: JSONBody[SearchIn],
        request: Request[Principal, Any, Any],
        db_session: NamedDependency[AsyncSession],
    ) -> SearchOut:
        searcher: Searcher = request.app.state.searcher
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
        )
        hits = await searcher.search(db_session, request.user.tenant_id, query)
        return SearchOut(results=[_result(h) for h in hits])
