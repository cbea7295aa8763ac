"""Search: the vector index, fusion, and the bounds of a query."""

from typing import Literal

from pydantic import BaseModel, Field


class SearchSettings(BaseModel):
    search_ef_search: int = Field(
        default=200, description="hnsw.ef_search of approximate (HNSW) searches: recall against latency."
    )
    search_hnsw_min_scope: int = Field(
        default=20_000,
        description="Active memories above which a user's search uses the HNSW index instead of exact.",
    )
    search_pool: int = Field(
        default=100, description="Candidates each ranking (vector, lexical) contributes before fusion."
    )
    graph_index_batch: int = Field(
        default=64,
        ge=1,
        description="Memories the workers add to the vector graph per transaction (a writer wanting one "
        "of them waits for one batch at most).",
    )
    graph_index_budget_s: float = Field(
        default=0.8,
        ge=0.0,
        description="Seconds each worker process spends adding memories to the graph per second, at most; "
        "0 turns the indexer off (search then reads every new memory exactly).",
    )
    graph_index_all: bool = Field(
        default=False,
        description="Add every active memory to the vector graph, instead of those of the tenants searched "
        "over all users and the scopes above search_hnsw_min_scope (for a deployment whose first such "
        "search must not read a tenant exactly).",
    )
    search_fusion: Literal["relative", "rrf"] = Field(
        default="relative",
        description="How hybrid search combines its rankings: relative (each score over its best, "
        "weighted) or rrf (reciprocal rank fusion).",
    )
    search_vector_weight: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Weight of the vector ranking in relative fusion (the lexical one weighs 1 - it).",
    )
    search_time_boost: float = Field(
        default=0.5,
        ge=0.0,
        le=10.0,
        description="Raise the memories whose fact held at a time the query names ('in May 2023', 'last "
        "week'): a score is multiplied by 1 + this when the fact began then, by 1 + this / 2 when it began "
        "earlier and still held, and divided by 1 + this; 0 turns it off.",
    )
    search_rrf_k: int = Field(default=60, description="k of reciprocal rank fusion: 1 / (k + rank).", ge=1)
    search_max_top_k: int = Field(default=100, description="Largest top_k a search may ask for.")
    search_as_of_all_users_max_versions: int = Field(
        default=100_000,
        ge=0,
        description="Versions a search over all users as of a time may read (it reads the tenant's history "
        "up to then); more: 422, name a user (0: no bound).",
    )
