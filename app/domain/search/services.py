"""Search: which index answers a query, the query's lexical form, and the embedder's record.

- A user's search is exact (the scope's B-tree, a distance per active memory: 100 % recall) unless the
  scope holds at least `search_hnsw_min_scope` active memories; then, and for `all_users`, the HNSW
  index over current memories answers, with `hnsw.ef_search` set explicitly and pgvector's iterative
  index scans (>= 0.8) where the server has them. Without them a filtered HNSW scan can come back
  short, so a large scope whose HNSW answer is short is searched exactly instead.
  Such a search also asks the workers' indexer to add its tenant's (or scope's) memories to the graph
  (`graph.want_graph`); until they are in, search reads them exactly beside it.
- `as_of` searches the scope's versions valid at that time, exactly; `valid_at` the memories whose fact
  held then.
- A time the query names ("in May 2023", "last week" at `reference_time`) raises the memories whose
  fact held then, by `search_time_boost` (0.5; docs/evaluation.md measures it).
- Hybrid mode fuses the vector ranking with a BM25 ranking of the memories' lexemes, each in its own
  language and the query's in its own (`app.lib.lexical`) (by
  relative score, or reciprocal rank fusion), so names and numbers the embedder does not capture
  are still found, and meaning the words do not share is found by the embedder.

The writer's candidates come from here too (`writer_candidates`), so what the writer is shown and what
a client finds are ranked by the same code.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import structlog
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import Settings
from app.db.models import EmbeddingConfig
from app.domain.search.graph import want_graph
from app.domain.search.repositories import Hit, SearchRepository, Source
from app.domain.search.schemas import SearchMode
from app.domain.search.tenant_embedder import EmbedderChoices, refuse_while_switching
from app.embeddings import Embedder, Embedders, embed_queries
from app.embeddings.base import chance_similarity
from app.embeddings.openai import EmbeddingError
from app.lib import tracing
from app.lib.errors import AsOfTooBroad, EmbedderMismatch, InvalidField, Unavailable
from app.lib.lexical import likely_languages, query_words
from app.lib.time_expressions import named_time

log = structlog.get_logger(__name__)

ITERATIVE_SCAN_VERSION = (0, 8, 0)
_SCOPE_SIZE_TTL_S = 60.0
# How long a process trusts that the stored vectors are its embedder's: a `memstore reembed` to
# another model is noticed within this time, instead of never.
_EMBEDDER_CHECK_TTL_S = 30.0
_SCOPE_SIZE_CACHE_MAX = 100_000
# How often a process records again that a scope is searched through the graph (a search's transaction
# may have been rolled back).
_GRAPH_WANTED_TTL_S = 600.0
# English words that match nearly every memory; leaving them out keeps the lexical ranking about the
# content (Postgres's English stop list keeps some of them, such as "user").
_STOPWORDS = frozenset(
    """
    a an the and or but of to in on at for with by from is am are was were be been being it its this that
    these those as so if then than too very can will just do does did i me my we our you your what which
    who whom when where why how user users
    """.split()  # noqa: SIM905  (one word list reads better than sixty quoted strings)
)


def query_time(text: str, reference_time: datetime | None) -> tuple[datetime | None, datetime | None] | None:
    """The stretch of time a query names, its phrase read in the query's likely languages and in English
    (as its words are: `lexical_words`), so "letzte Woche" and "上个月" are boosted as "last week" is."""
    return named_time(text, reference_time, (*likely_languages(text), "en"))


def lexical_words(text: str) -> tuple[list[str], list[str]]:
    """The query's text search configurations (its language's: `app.lib.lexical`) and its content words
    for the lexical ranking (letters and digits only, lower case, each once, at most 64); Postgres then
    drops the language's stop words and stems the rest."""
    configs, words = query_words(text)
    return configs, [w for w in words if w not in _STOPWORDS]


@dataclass(frozen=True)
class SearchQuery:
    """One search (api.md `POST /v1/memories/search`)."""

    query: str
    user_id: str | None
    top_k: int = 10
    threshold: float | None = 0.0
    as_of: datetime | None = None
    agent_id: str | None = None
    tags: tuple[str, ...] = ()
    mode: SearchMode = "hybrid"
    all_users: bool = False
    include_expired: bool = False  # also memories whose expires_at has passed (at `as_of`, or now)
    valid_at: datetime | None = None  # only what held then (valid time), superseded memories included
    # The "now" of the query's time words ("last week"); None: the time of the search.
    reference_time: datetime | None = None
    # Weight of a memory's fit to a time the query names (`search_time_boost` when None; 0: none).
    time_boost: float | None = None


@dataclass
class Searcher:
    """Search for one process: settings, the embedder, and what it learnt about the database."""

    settings: Settings
    embedder: Embedder  # the deployment's
    # Every embedder this process has loaded, the deployment's and those tenants chose, and the tenants'
    # choices (`search.tenant_embedder`).
    embedders: Embedders | None = None
    choices: EmbedderChoices = field(default_factory=EmbedderChoices)
    _iterative_scan: bool | None = None
    _embedder_checked_at: float | None = None  # monotonic time of the last good check
    # (tenant, user) -> (is the scope large, when that was read)
    _large_scopes: dict[tuple[uuid.UUID, str], tuple[bool, float]] = field(default_factory=dict)
    # Scopes (None: all users of the tenant) recorded as searched through the graph (`graph.want_graph`),
    # and when (monotonic clock)
    _graph_wanted: dict[tuple[uuid.UUID, str | None], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.embedders is None:
            self.embedders = Embedders(self.settings, default=self.embedder)

    async def tenant_embedder(self, session: AsyncSession, tenant_id: uuid.UUID) -> Embedder:
        """The embedder the tenant's new and edited memories are embedded with: its own, else the
        deployment's; while it moves to another, that one (the move re-embeds what was written before)."""
        choice = await self.choices.get(session, tenant_id)
        name = choice.switching_to or choice.own
        if name is None or name == self.settings.embedder:
            return self.embedder
        assert self.embedders is not None
        return self.embedders.get(name)

    async def embedder_for(self, session: AsyncSession, tenant_id: uuid.UUID) -> Embedder:
        """The tenant's embedder for a search; refused while the tenant moves to another
        (`embedder_mismatch`: its vectors are of two, and nothing may compare them). Where it is the
        deployment's, the stored vectors are checked to be its (`check_embedder`)."""
        refuse_while_switching(await self.choices.get(session, tenant_id))
        embedder = await self.tenant_embedder(session, tenant_id)
        if embedder is self.embedder:
            await self.check_embedder(session)
        return embedder

    @tracing.operation("search_memory", memory_operation="search_memory")
    async def search(self, session: AsyncSession, tenant_id: uuid.UUID, query: SearchQuery) -> list[Hit]:
        """The best `top_k` memories for `query`, best first."""
        if query.user_id is None and not query.all_users:
            raise InvalidField(
                "user_id is required unless all_users is true",
                details={"user_id": "required"},
            )
        if query.top_k > self.settings.search_max_top_k:
            raise InvalidField(
                f"top_k is at most {self.settings.search_max_top_k}",
                details={"top_k": f"at most {self.settings.search_max_top_k}"},
            )
        embedder = await self.embedder_for(session, tenant_id)
        try:
            [embedding] = await embed_queries(embedder, [query.query])
        except EmbeddingError as exc:
            raise Unavailable(
                "the embedding model is unavailable", details={"embedder": str(exc)[:200]}
            ) from exc
        user_id = None if query.all_users else query.user_id
        if user_id is None and query.as_of is not None:
            await self._bound_history_read(session, tenant_id, query.as_of)
        elif user_id is None and query.valid_at is not None:
            await self._bound_tenant_read(session, tenant_id)
        return await self._run(session, tenant_id, user_id, embedding, query, embedder.name)

    async def _bound_history_read(self, session: AsyncSession, tenant_id: uuid.UUID, as_of: datetime) -> None:
        """A search over every user as of a time reads the tenant's history up to then: refused (422)
        when that is more than `search_as_of_all_users_max_versions` versions, counted no further."""
        bound = self.settings.search_as_of_all_users_max_versions
        if bound and await SearchRepository(session).versions_reach(tenant_id, as_of, bound + 1):
            raise AsOfTooBroad(
                f"A search over all users as of a time may read at most {bound} versions, and this "
                "tenant has more; search one user (user_id) as of that time.",
                details={"max_versions": bound},
            )

    async def _bound_tenant_read(self, session: AsyncSession, tenant_id: uuid.UUID) -> None:
        """A search over every user at a valid time reads the tenant's memories exactly (replaced facts
        are in no index of current ones): refused (422) beyond `search_as_of_all_users_max_versions`
        memories, counted no further."""
        bound = self.settings.search_as_of_all_users_max_versions
        if bound and await SearchRepository(session).memories_reach(tenant_id, bound + 1):
            raise AsOfTooBroad(
                f"A search over all users at a valid time may read at most {bound} memories, and this "
                "tenant has more; search one user (user_id) at that time.",
                details={"max_versions": bound},
            )

    async def writer_candidates(
        self,
        session: AsyncSession,
        tenant_id: uuid.UUID,
        user_id: str,
        texts: Sequence[str],
        limit: int,
        embedder: Embedder | None = None,
    ) -> list[list[Hit]]:
        """For each text, the scope's nearest active memories (vector ranking, no threshold), by the
        tenant's embedder (`embedder`, when the caller has it)."""
        texts = [t for t in texts if t.strip()]
        if not texts:
            return []
        if embedder is None:
            embedder = await self.embedder_for(session, tenant_id)
        elif embedder is self.embedder:
            await self.check_embedder(session)
        embeddings = await embedder.embed(list(texts))
        repo = SearchRepository(session)
        if not await self._large_scope(repo, tenant_id, user_id):
            return await repo.nearest_in_scope(tenant_id, user_id, embeddings, limit)  # all in one statement
        found = []
        for text_, embedding in zip(texts, embeddings, strict=True):
            query = SearchQuery(text_, user_id, top_k=limit, threshold=None, mode="vector", time_boost=0.0)
            found.append(await self._run(session, tenant_id, user_id, embedding, query, embedder.name))
        return found

    async def _run(
        self,
        session: AsyncSession,
        tenant_id: uuid.UUID,
        user_id: str | None,
        embedding: list[float],
        query: SearchQuery,
        embedder: str,
    ) -> list[Hit]:
        repo = SearchRepository(session)
        source: Source
        vector = query.mode != "lexical"
        if query.as_of is not None:
            source = "as_of"
        elif query.valid_at is not None:
            source = "exact"  # replaced facts are in no index of current ones: read the rows
        elif user_id is None or (vector and await self._large_scope(repo, tenant_id, user_id)):
            source = "hnsw"  # a lexical search of one scope has no graph to use: it stays on the scope
        else:
            source = "exact"
        if source == "hnsw" and vector:
            await self._want_graph(session, tenant_id, user_id)
            await repo.tune_hnsw(
                max(self.settings.search_ef_search, self.settings.search_pool, query.top_k),
                iterative=await self._has_iterative_scan(repo),
            )
        hits = await self._fetch(repo, source, tenant_id, user_id, embedding, vector, query, embedder)
        if source == "hnsw" and user_id is not None and len(hits) < query.top_k:
            # A filtered graph scan can run out before it finds top_k rows of the scope (pgvector < 0.8
            # filters after the scan; 0.8's iterative scan stops at hnsw.max_scan_tuples); exact cannot.
            hits = await self._fetch(repo, "exact", tenant_id, user_id, embedding, vector, query, embedder)
        return hits

    async def _fetch(
        self,
        repo: SearchRepository,
        source: Source,
        tenant_id: uuid.UUID,
        user_id: str | None,
        embedding: list[float],
        vector: bool,
        query: SearchQuery,
        embedder: str,
    ) -> list[Hit]:
        lex_configs, words = lexical_words(query.query) if query.mode != "vector" else ([], [])
        boost = self.settings.search_time_boost if query.time_boost is None else query.time_boost
        hits = await repo.search(
            source,
            tenant_id=tenant_id,
            user_id=user_id,
            embedding=embedding,
            vector=vector,
            words=words,
            lex_configs=lex_configs,
            top_k=query.top_k,
            pool=self.settings.search_pool,
            fusion=self.settings.search_fusion,
            vector_weight=self.settings.search_vector_weight,
            vector_base=chance_similarity(embedder),
            rrf_k=self.settings.search_rrf_k,
            threshold=query.threshold if vector else None,
            agent_id=query.agent_id,
            tags=query.tags,
            as_of=query.as_of,
            include_expired=query.include_expired,
            valid_at=query.valid_at,
            named=query_time(query.query, query.reference_time) if boost > 0 else None,
            time_boost=boost,
        )
        if vector and words and self.settings.search_fusion == "rrf":
            # The fused score as a share of the best possible (first in both rankings).
            best = 2.0 / (self.settings.search_rrf_k + 1)
            hits = [_rescored(h, h.score / best) for h in hits]
        return hits

    async def _large_scope(self, repo: SearchRepository, tenant_id: uuid.UUID, user_id: str) -> bool:
        key = (tenant_id, user_id)
        cached = self._large_scopes.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[1] < _SCOPE_SIZE_TTL_S:
            return cached[0]
        large = await repo.scope_reaches(tenant_id, user_id, self.settings.search_hnsw_min_scope)
        if len(self._large_scopes) >= _SCOPE_SIZE_CACHE_MAX:
            self._large_scopes.clear()
        self._large_scopes[key] = (large, now)
        return large

    async def _want_graph(self, session: AsyncSession, tenant_id: uuid.UUID, user_id: str | None) -> None:
        """A search through the graph asks the indexer for its scope's memories: once per process, and
        again after a while, in case the transaction that recorded it was rolled back."""
        key = (tenant_id, user_id)
        now = time.monotonic()
        if now - self._graph_wanted.get(key, -_GRAPH_WANTED_TTL_S) < _GRAPH_WANTED_TTL_S:
            return
        await want_graph(session, tenant_id, user_id)
        if len(self._graph_wanted) >= _SCOPE_SIZE_CACHE_MAX:
            self._graph_wanted.clear()
        self._graph_wanted[key] = now

    async def _has_iterative_scan(self, repo: SearchRepository) -> bool:
        if self._iterative_scan is None:
            version = await repo.vector_version()
            self._iterative_scan = version >= ITERATIVE_SCAN_VERSION
            log.info("search.pgvector", version=".".join(map(str, version)), iterative=self._iterative_scan)
        return self._iterative_scan

    async def check_embedder(self, session: AsyncSession) -> None:
        """Record the embedder on first use; refuse to mix vectors of another one (re-checked now and
        then: the stored vectors may be re-embedded by another process)."""
        checked = self._embedder_checked_at
        if checked is not None and time.monotonic() - checked < _EMBEDDER_CHECK_TTL_S:
            return
        await record_embedder(session, self.embedder)
        self._embedder_checked_at = time.monotonic()


async def record_embedder(session: AsyncSession, embedder: Embedder) -> EmbeddingConfig:
    """The stored embedder record (created for `embedder` if there is none); raises on a mismatch.

    Read first, written only when missing: on a Citus cluster the record is a reference table's row,
    which a write reaches on every node (an INSERT … ON CONFLICT DO NOTHING too), so with one worker
    down every search would fail; a read is answered by the coordinator's own copy."""
    config = await session.scalar(select(EmbeddingConfig).where(EmbeddingConfig.id == 1))
    if config is None:
        await session.execute(
            insert(EmbeddingConfig)
            .values(id=1, name=embedder.name, dim=embedder.dim)
            .on_conflict_do_nothing(index_elements=["id"])
        )
        config = await session.scalar(select(EmbeddingConfig).where(EmbeddingConfig.id == 1))
    assert config is not None
    if embedder.name not in {config.name, config.target_name}:
        msg = (
            f"the stored vectors were made by embedder {config.name!r}, not the configured "
            f"{embedder.name!r}; run `memstore reembed` to re-embed them"
        )
        raise EmbedderMismatch(msg, details={"stored": config.name, "configured": embedder.name})
    return config


def _rescored(hit: Hit, score: float) -> Hit:
    return Hit(**{**hit.__dict__, "score": score})
