"""Bodies of `POST /v1/memories/search` (api.md, "Memories")."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from litestar.openapi.spec import OpenAPIType, Schema

from app.domain.memories.schemas import MemoryOut
from app.lib.validation import Moment

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
SearchMode = Literal["hybrid", "vector", "lexical"]


class SearchIn(msgspec.Struct, forbid_unknown_fields=True):
    # What the schema adds (app.server.openapi): a search names its user, or asks for all of them.
    __openapi__: ClassVar[dict[str, Any]] = {
        "any_of": [
            Schema(required=["user_id"], properties={"user_id": Schema(type=OpenAPIType.STRING)}),
            Schema(required=["all_users"], properties={"all_users": Schema(const=True)}),
        ]
    }

    query: Annotated[str, msgspec.Meta(min_length=1, max_length=10_000)]
    user_id: Id | None = None  # required unless all_users
    top_k: Annotated[int, msgspec.Meta(ge=1, extra={"deployment": "max_top_k"})] = 10
    # Least cosine similarity of a vector match; in hybrid mode a memory that shares words with the
    # query is kept whatever its similarity.
    threshold: Annotated[float, msgspec.Meta(ge=-1.0, le=1.0)] = 0.0
    as_of: Moment | None = None
    agent_id: Id | None = None
    tags: Annotated[list[Id], msgspec.Meta(max_length=50)] = msgspec.field(default_factory=list)
    mode: SearchMode = "hybrid"
    all_users: bool = False  # every user of the tenant (approximate, through the HNSW index)
    include_expired: bool = False  # also memories whose expires_at has passed
    valid_at: Moment | None = None  # only memories whose fact held then (valid time); needs user_id
    # The "now" of the query's time words ("last week"), for the time boost; default: now.
    reference_time: Moment | None = None


class SearchResult(msgspec.Struct):
    memory: MemoryOut
    # The ranking's score: cosine (vector), BM25 (lexical), fused in 0..1 (hybrid; 1: best in both)
    score: float
    similarity: float | None  # cosine similarity to the query (None: the memory has no vector)


class SearchOut(msgspec.Struct):
    results: list[SearchResult]
