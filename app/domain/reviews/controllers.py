"""`/v1/admin/reviews`: the writer ops held for a human, and their approval or rejection."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Annotated, Literal

from litestar import Controller, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db.models import Memory, Review
from app.domain.accounts.auth import requires_role
from app.domain.accounts.services import Caller
from app.domain.reviews import services
from app.domain.reviews.repositories import ReviewRepository
from app.domain.reviews.schemas import DecisionIn, ReviewList, ReviewOut, TargetOut
from app.embeddings.base import Embedder
from app.lib.errors import InvalidField, MemoryChanged, NotFoundError, ReviewDecided, error_responses
from app.lib.paging import KeysetCursor, cursor_after, decode_keyset, paged
from app.lib.params import Limit


async def _out(session: AsyncSession, tenant_id: uuid.UUID, reviews: Sequence[Review]) -> list[ReviewOut]:
    """Reviews with the memories they name as they are now (one query for the page)."""
    ids = {uuid.UUID(t["memory_id"]) for r in reviews for t in r.targets}
    heads = (
        {
            m.id: m
            for m in (
                await session.scalars(select(Memory).where(Memory.tenant_id == tenant_id, Memory.id.in_(ids)))
            ).all()
        }
        if ids
        else {}
    )
    out = []
    for review in reviews:
        targets = []
        for target in review.targets:
            head = heads.get(uuid.UUID(target["memory_id"]))
            targets.append(
                TargetOut(
                    memory_id=uuid.UUID(target["memory_id"]),
                    version=int(target["version"]),
                    current_version=head.version if head else None,
                    current_status=head.status if head else None,
                    current_content=head.content if head else None,
                )
            )
        out.append(
            ReviewOut(
                id=review.id,
                user_id=review.user_id,
                agent_id=review.agent_id,
                status=review.status,
                op=review.op,
                targets=targets,
                changeset_id=review.changeset_id,
                chunk_id=review.chunk_id,
                writer=review.writer,
                model=review.model,
                profile=review.profile,
                prompt_hash=review.prompt_hash,
                memory_at=review.memory_at,
                created_at=review.created_at,
                decided_by=review.decided_by,
                decided_at=review.decided_at,
                decision_reason=review.decision_reason,
                decision_changeset_id=review.decision_changeset_id,
                applicable=review.status == "pending"
                and all(t.current_version == t.version and t.current_status == "active" for t in targets),
            )
        )
    return out


class ReviewController(Controller):
    path = "/v1/admin/reviews"
    tags = ["admin"]
    guards = [requires_role("admin")]

    @get("/", summary="Writer ops held for review, oldest first", responses=error_responses(InvalidField))
    async def list_reviews(
        self,
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        status: Annotated[Literal["pending", "approved", "rejected", "all"], QueryParameter()] = "pending",
        user_id: Annotated[str | None, QueryParameter(min_length=1, max_length=200)] = None,
        limit: Limit = 100,
        cursor: KeysetCursor = None,
    ) -> ReviewList:
        after = decode_keyset(cursor) if cursor else None
        page = await paged(
            lambda n: ReviewRepository(db_session).page(
                caller.tenant_id,
                status=None if status == "all" else status,
                user_id=user_id,
                after=after,
                limit=n,
            ),
            limit,
            cursor_after,
        )
        return ReviewList(
            items=await _out(db_session, caller.tenant_id, page.items), next_cursor=page.next_cursor
        )

    @get(
        "/{review_id:uuid}",
        summary="One held op, with the memories it names as they are now",
        responses=error_responses(NotFoundError),
    )
    async def get_review(
        self,
        review_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
    ) -> ReviewOut:
        review = await ReviewRepository(db_session).get(caller.tenant_id, review_id)
        if review is None:
            raise NotFoundError("No such review.")
        [out] = await _out(db_session, caller.tenant_id, [review])
        return out

    @post(
        "/{review_id:uuid}/approve",
        status_code=HTTP_200_OK,
        summary="Apply a held op as new versions",
        responses=error_responses(NotFoundError, ReviewDecided, MemoryChanged),
    )
    async def approve(
        self,
        review_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        embedder: NamedDependency[Embedder],
        settings: NamedDependency[Settings],
        data: JSONBody[DecisionIn | None] = None,
    ) -> ReviewOut:
        review = await services.approve(
            db_session,
            caller.tenant_id,
            review_id,
            who=caller.who((data or DecisionIn()).reason),
            embedder=embedder,
            max_chars=settings.max_memory_chars,
        )
        [out] = await _out(db_session, caller.tenant_id, [review])
        return out

    @post(
        "/{review_id:uuid}/reject",
        status_code=HTTP_200_OK,
        summary="Refuse a held op; nothing changes",
        responses=error_responses(NotFoundError, ReviewDecided),
    )
    async def reject(
        self,
        review_id: FromPath[uuid.UUID],
        caller: NamedDependency[Caller],
        db_session: NamedDependency[AsyncSession],
        data: JSONBody[DecisionIn | None] = None,
    ) -> ReviewOut:
        review = await services.reject(
            db_session,
            caller.tenant_id,
            review_id,
            who=caller.who((data or DecisionIn()).reason),
        )
        [out] = await _out(db_session, caller.tenant_id, [review])
        return out
