"""SQL of search: one statement per search, composed from fixed fragments by what the query needs.

Three sources of rows:
- the scope's active memories, exactly: the B-tree `ix_memories_scope` narrows to the scope and the
  distance is computed for each row (100 % recall). The ORDER BY is `distance + 0` on purpose, so the
  planner cannot answer it from the HNSW index instead;
- active memories through the HNSW index `ix_memories_embedding_hnsw` (partial: current rows the
  indexer has added, `in_graph`), for cross-scope searches and very large scopes, merged with the
  active rows not yet in the graph, read exactly (`ix_memories_graph_tail`; `search.graph`); the
  caller sets `hnsw.ef_search` (and iterative scans where pgvector has them) in the same transaction
  first. The graph's user filter is written so the B-tree is not used (`user_id || ''`): the point of
  that half is the index scan;
- the bank as of a time: for each memory of the scope, its latest version at or before that time
  (valid from its `created_at` until the next version's), kept if it was active then.

The lexical ranking is BM25 over each memory's lexemes in its own language (`memories.lexemes`, and
the versions' for the bank as of a time; `app.lib.lexical`), against the query's analysed the same way.
Vector and lexical candidates are fused by relative score — each ranking's score divided by its best,
weighted, summed — which ranked LoCoMo's evidence better than reciprocal rank fusion (1 / (k + rank)
summed; still available) with a semantic embedder (docs/benchmarks.md, "Retrieval on LoCoMo").
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Literal

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import vector_text

Source = Literal["exact", "hnsw", "as_of"]

# The query vector, bound as text (`vector_text`: this is on every search's path).
_QUERY = "CAST(:embedding AS vector)"

# Every table named with its tenant as a value: on a Citus cluster a join or a subquery correlated to
# the tenant of another row prunes no shard, and the statement was refused ("complex joins").
_AS_OF_BANK = """
bank AS (
    SELECT v.memory_id AS id, v.tenant_id, v.user_id, m.agent_id, m.run_id, v.content, v.tags, v.owner,
           v.memory_at, v.status, v.version, v.expires_at, coalesce(v.language, 'en') AS language,
           v.valid_from, v.valid_to,
           -- the memory's current vector while the text is the same (it follows a re-embedding);
           -- else the version's, or, for a version that changed no text, the last one written
           CASE WHEN v.content = m.content THEN m.embedding ELSE coalesce(v.embedding, (
               SELECT w.embedding FROM memory_versions w
               WHERE w.tenant_id = :tenant_id AND w.memory_id = v.memory_id AND w.version < v.version
                 AND w.embedding IS NOT NULL
               ORDER BY w.version DESC LIMIT 1
           )) END AS embedding,
           m.created_at, v.created_at AS updated_at{lexemes}
    FROM (
        SELECT DISTINCT ON (memory_id) *
        FROM memory_versions
        WHERE tenant_id = :tenant_id {user_filter} AND created_at <= :as_of
        ORDER BY memory_id, version DESC
    ) v
    JOIN memories m ON m.tenant_id = :tenant_id AND m.id = v.memory_id
    WHERE {status_filter}{expiry_filter}
)"""


# Since when a fact held (valid time; `memories.repositories.held_at`): its valid_from, or, unknown, when
# it was stated; one that ended before it was stated held, as far as the bank knows, from ever.
_HELD_SINCE = (
    "CASE WHEN {p}valid_from IS NULL AND {p}valid_to <= coalesce({p}memory_at, {created})"
    " THEN '-infinity'::timestamptz ELSE coalesce({p}valid_from, {p}memory_at, {created}) END"
)

# What held at `:valid_at`: active or superseded since, from `_HELD_SINCE` until its valid_to.
_HELD = (
    "{p}status IN ('active', 'superseded') AND "
    + _HELD_SINCE
    + " <= :valid_at AND ({p}valid_to IS NULL OR {p}valid_to > :valid_at)"
)

# How well a memory's valid time fits the time a query names (`:named_from` .. `:named_to`, either open):
# 1 when its fact began then, 0.5 when its validity is known and it began before and still held then,
# else 0. A fact whose valid time is unknown began when it was stated, and may have been an event of
# that day as much as a state that lasted: it is not counted as holding later.
_BEGAN = _HELD_SINCE.format(p="b.", created="b.created_at")
_NAMED_FROM = "coalesce(CAST(:named_from AS timestamptz), '-infinity')"
_NAMED_TO = "coalesce(CAST(:named_to AS timestamptz), 'infinity')"
_TIME_FIT = f"""CASE
           WHEN {_BEGAN} >= {_NAMED_FROM} AND {_BEGAN} < {_NAMED_TO} THEN 1.0
           WHEN (b.valid_from IS NOT NULL OR b.valid_to IS NOT NULL) AND {_BEGAN} < {_NAMED_TO}
            AND coalesce(b.valid_to, 'infinity') > {_NAMED_FROM} THEN 0.5
           ELSE 0.0 END"""

# Not expired by the time the bank is read as of.
_UNEXPIRED_AS_OF = " AND (v.expires_at IS NULL OR v.expires_at > :as_of)"


# Per query vector (each cast once), the exact route of a vector-only search of one scope: the writer's
# candidates, which never include an expired memory.
_NEAREST_IN_SCOPE = text(
    """SELECT q.ord, b.id, b.user_id, b.agent_id, b.run_id, b.content, b.tags, b.owner, b.status, b.version,
       b.memory_at, b.created_at, b.updated_at, b.expires_at, b.language, b.valid_from, b.valid_to,
       1 - v.distance AS score,
       1 - v.distance AS similarity
FROM unnest(CAST(CAST(:embeddings AS text[]) AS vector[])) WITH ORDINALITY AS q(e, ord)
CROSS JOIN LATERAL (
    SELECT id, embedding <=> q.e AS distance FROM memories
    WHERE tenant_id = :tenant_id AND user_id = :user_id AND status = 'active' AND embedding IS NOT NULL
      AND (expires_at IS NULL OR expires_at > now())
    ORDER BY (embedding <=> q.e) + 0 LIMIT :top_k
) v
JOIN memories b ON b.tenant_id = :tenant_id AND b.id = v.id
ORDER BY q.ord, v.distance, b.created_at, b.id"""
)


@dataclass(frozen=True)
class Hit:
    """A memory found by a search, as it stands (or stood, with as_of), and how well it matched."""

    id: uuid.UUID
    user_id: str
    agent_id: str | None
    run_id: str | None
    content: str
    tags: list[str]
    owner: str
    status: str
    version: int
    memory_at: datetime | None
    created_at: datetime
    updated_at: datetime
    score: float
    similarity: float | None
    expires_at: datetime | None = None
    language: str | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None


# BM25's term-frequency saturation and length normalisation: Anserini's defaults, which also ranked
# best of those tried on LoCoMo (bench/retrieval.py).
BM25_K1 = 0.9
BM25_B = 0.4
# Memories read for the corpus figures of BM25 (count, mean length). Exact for any scope searched
# exactly (below `search_hnsw_min_scope`); for larger sets the first this many stand for the rest.
BM25_STATS_ROWS = 20_000

# How the two rankings of a hybrid search are combined.
Fusion = Literal["relative", "rrf"]


@lru_cache(maxsize=256)
def _statement(  # noqa: PLR0912  (one branch per option)
    source: Source,
    vector: bool,
    lexical: bool,
    scoped: bool,
    agent: bool,
    tags: bool,
    threshold: bool,
    fusion: Fusion = "relative",
    include_expired: bool = False,
    valid: bool = False,
    timed: bool = False,
) -> TextClause:
    """The search statement for one combination of options (built once per combination)."""
    ctes: list[str] = []
    filters = []
    lex_filters = []
    if source == "as_of":
        ctes.append(
            _AS_OF_BANK.format(
                user_filter="AND user_id = :user_id" if scoped else "",
                status_filter=_HELD.format(p="v.", created="m.created_at")
                if valid
                else "v.status = 'active'",
                expiry_filter="" if include_expired else _UNEXPIRED_AS_OF,
                # versions written before they carried lexemes were English
                lexemes=", coalesce(v.lexemes, to_tsvector('english'::regconfig, v.content)) AS lexemes"
                if lexical
                else "",
            )
        )
        relation = "bank"
    else:
        relation = "memories"
        status = _HELD.format(p="", created="created_at") if valid else "status = 'active'"
        filters.append(f"tenant_id = :tenant_id AND {status}")
        lex_filters.append(f"tenant_id = :tenant_id AND {status}")
        if scoped:
            # The vector half of the HNSW route must walk the graph, not the scope's B-tree; the
            # lexical half reads the scope (or the GIN index) either way.
            filters.append("user_id || '' = :user_id" if source == "hnsw" else "user_id = :user_id")
            lex_filters.append("user_id = :user_id")
        if not include_expired:  # checked on the rows the scope, graph or GIN index yields
            filters.append("(expires_at IS NULL OR expires_at > now())")
            lex_filters.append("(expires_at IS NULL OR expires_at > now())")
    if agent:
        filters.append("agent_id = :agent_id")
        lex_filters.append("agent_id = :agent_id")
    if tags:
        filters.append("tags @> CAST(:tags AS text[])")
        lex_filters.append("tags @> CAST(:tags AS text[])")
    where = " AND ".join(filters) or "TRUE"
    lex_where = " AND ".join(lex_filters) or "TRUE"

    if vector:
        ctes.append(_nearest(source, relation, where, lex_where, threshold=threshold))
    if lexical:
        # BM25 over the memories' lexemes: the memories holding a query lexeme (GIN index or the
        # scope), which query lexemes each holds, each lexeme's document frequency among them (every
        # memory that holds it is among them), the corpus's size and mean length. A memory is one short
        # statement, so a lexeme's frequency in it counts as 1: reading real frequencies (unnesting
        # each memory's lexemes) cost seven times as much for no measurable recall (bench/retrieval.py).
        ctes.append(
            f"""lex_terms AS (
    SELECT DISTINCT t.lexeme, quote_literal(t.lexeme)::tsquery AS q
    FROM unnest(CAST(:lex_configs AS regconfig[])) c(config)
    CROSS JOIN LATERAL unnest(tsvector_to_array(to_tsvector(c.config, :lexical_text))) t(lexeme)
),
lex_hits AS (
    SELECT d.id, length(d.lexemes) AS len, t.lexeme
    FROM {relation} d JOIN lex_terms t ON d.lexemes @@ t.q
    WHERE {lex_where}
      AND d.lexemes @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM lex_terms)
),
lex_corpus AS (
    SELECT count(*)::float8 AS n, greatest(coalesce(avg(length(lexemes)), 1), 1)::float8 AS avgdl
    FROM (SELECT lexemes FROM {relation} WHERE {lex_where} LIMIT :stats_rows) c
),
lex_idf AS (
    SELECT h.lexeme, ln(1 + (greatest(c.n - count(*), 0) + 0.5) / (count(*) + 0.5)) AS idf
    FROM lex_hits h CROSS JOIN lex_corpus c GROUP BY h.lexeme, c.n
),
lex AS (
    SELECT id, rank, row_number() OVER (ORDER BY rank DESC, id) AS r FROM (
        SELECT h.id, sum(
                   i.idf * {BM25_K1 + 1} / (1 + {BM25_K1} * ({1 - BM25_B} + {BM25_B} * h.len / c.avgdl))
               ) AS rank
        FROM lex_hits h JOIN lex_idf i ON i.lexeme = h.lexeme CROSS JOIN lex_corpus c
        GROUP BY h.id ORDER BY rank DESC, h.id LIMIT :pool
    ) l
)"""
        )
    similarity = f"1 - coalesce(found.distance, b.embedding <=> {_QUERY})"
    if vector and lexical:
        ctes.append(
            # MATERIALIZED: joined to the memories by a plain column, not by the coalesce() it would
            # be inlined as, which Postgres will not use for an index probe under a row-level policy.
            """found AS MATERIALIZED (
    SELECT coalesce(vec.id, lex.id) AS id, vec.distance, vec.r AS vec_r, lex.rank, lex.r AS lex_r
    FROM vec FULL OUTER JOIN lex ON lex.id = vec.id
)"""
        )
        if fusion == "rrf":
            score = "coalesce(1.0 / (:rrf_k + found.vec_r), 0) + coalesce(1.0 / (:rrf_k + found.lex_r), 0)"
        else:
            # Each ranking's score as a share of its best, weighted: a memory first in both scores 1.
            # The similarity is counted from the embedder's chance level (`:vector_base`,
            # `embeddings.base.CHANCE_SIMILARITY`): an embedder whose cosines all crowd between 0.75
            # and 0.95 (E5) would otherwise give every candidate nearly the same share.
            score = f"""(:vector_weight * greatest(coalesce({similarity}, 0) - :vector_base, 0)
           / greatest(coalesce((SELECT max(1 - distance) FROM vec), 1) - :vector_base, 1e-9)
         + (1 - :vector_weight) * coalesce(found.rank / (SELECT max(rank) FROM lex), 0))"""
    elif vector:
        ctes.append("found AS (\n    SELECT id, distance FROM vec\n)")
        score = "1 - found.distance"
    else:
        ctes.append("found AS (\n    SELECT id, NULL::float8 AS distance, rank FROM lex\n)")
        score = "found.rank"
    if timed:
        # A time named in the query: a memory's score is multiplied by 1 + :time_boost when its fact
        # began then (half that when it held through it), over 1 + :time_boost, so it stays in its range.
        score = f"({score}) * (1 + :time_boost * {_TIME_FIT}) / (1 + :time_boost)"
    sql = f"""WITH {", ".join(ctes)}
SELECT b.id, b.user_id, b.agent_id, b.run_id, b.content, b.tags, b.owner, b.status, b.version,
       b.memory_at, b.created_at, b.updated_at, b.expires_at, b.language, b.valid_from, b.valid_to,
       {score} AS score,
       {similarity} AS similarity
FROM found JOIN {relation} b ON b.id = found.id AND b.tenant_id = :tenant_id
ORDER BY score DESC, found.distance NULLS LAST, b.created_at, b.id
LIMIT :top_k"""
    return text(sql)


def _nearest(source: Source, relation: str, where: str, tail_where: str, *, threshold: bool) -> str:
    """The vector ranking's CTE: the `:pool` nearest rows of the source, ranked."""
    exact = f"(embedding <=> {_QUERY}) + 0"
    cut = f" AND embedding <=> {_QUERY} <= :max_distance" if threshold else ""
    if source == "hnsw":
        # The graph's nearest, and the nearest of its tail (rows written since the indexer last ran,
        # through `ix_memories_graph_tail`) exactly: nothing written is missing meanwhile.
        graph = f"embedding <=> {_QUERY}"
        nearest = f"""(
            SELECT id, {graph} AS distance FROM memories
            WHERE {where} AND in_graph AND embedding IS NOT NULL{cut}
            ORDER BY {graph} LIMIT :pool
        ) UNION ALL (
            SELECT id, {exact} AS distance FROM memories
            WHERE {tail_where} AND NOT in_graph AND embedding IS NOT NULL{cut}
            ORDER BY {exact} LIMIT :pool
        )
        ORDER BY distance LIMIT :pool"""
    else:
        nearest = f"""SELECT id, {exact} AS distance FROM {relation}
        WHERE {where} AND embedding IS NOT NULL{cut}
        ORDER BY {exact} LIMIT :pool"""
    return f"""vec AS (
    SELECT id, distance, row_number() OVER (ORDER BY distance) AS r FROM (
        {nearest}
    ) v
)"""


class SearchRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def vector_version(self) -> tuple[int, ...]:
        """The installed pgvector version, e.g. (0, 8, 0)."""
        raw = await self.session.scalar(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))
        return tuple(int(p) for p in str(raw or "0").split(".") if p.isdigit())

    async def versions_reach(self, tenant_id: uuid.UUID, as_of: datetime, size: int) -> bool:
        """Whether the tenant has at least `size` versions written by `as_of` (reads at most `size` index
        entries of `ix_memory_versions_scope_time`)."""
        found = await self.session.scalar(
            text(
                "SELECT count(*) FROM (SELECT 1 FROM memory_versions WHERE tenant_id = :tenant_id "
                "AND created_at <= :as_of LIMIT :size) v"
            ),
            {"tenant_id": tenant_id, "as_of": as_of, "size": size},
        )
        return int(found or 0) >= size

    async def memories_reach(self, tenant_id: uuid.UUID, size: int) -> bool:
        """Whether the tenant has at least `size` memories (reads at most `size` index entries)."""
        found = await self.session.scalar(
            text("SELECT count(*) FROM (SELECT 1 FROM memories WHERE tenant_id = :tenant_id LIMIT :size) m"),
            {"tenant_id": tenant_id, "size": size},
        )
        return int(found or 0) >= size

    async def scope_reaches(self, tenant_id: uuid.UUID, user_id: str, size: int) -> bool:
        """Whether the scope has at least `size` active memories (reads at most `size` index entries)."""
        found = await self.session.scalar(
            text(
                "SELECT count(*) FROM (SELECT 1 FROM memories WHERE tenant_id = :tenant_id "
                "AND user_id = :user_id AND status = 'active' LIMIT :size) s"
            ),
            {"tenant_id": tenant_id, "user_id": user_id, "size": size},
        )
        return int(found or 0) >= size

    async def tune_hnsw(self, ef_search: int, *, iterative: bool) -> None:
        """Search parameters of the HNSW index for the rest of this transaction.

        A sequential scan is ruled out too: this path exists to walk the graph, and on a small or
        freshly analysed table the planner would otherwise sort the whole tenant instead.
        """
        iterative_scan = ", set_config('hnsw.iterative_scan', 'relaxed_order', true)" if iterative else ""
        await self.session.execute(
            text(
                "SELECT set_config('hnsw.ef_search', :ef, true), "
                f"set_config('enable_seqscan', 'off', true){iterative_scan}"
            ),
            {"ef": str(ef_search)},
        )

    async def search(
        self,
        source: Source,
        *,
        tenant_id: uuid.UUID,
        user_id: str | None,
        embedding: list[float],
        vector: bool,
        words: Sequence[str],
        lex_configs: Sequence[str],
        top_k: int,
        pool: int,
        fusion: Fusion,
        vector_weight: float,
        rrf_k: int,
        threshold: float | None,
        agent_id: str | None,
        tags: Sequence[str],
        as_of: datetime | None,
        include_expired: bool = False,
        vector_base: float = 0.0,
        valid_at: datetime | None = None,
        named: tuple[datetime | None, datetime | None] | None = None,
        time_boost: float = 0.0,
    ) -> list[Hit]:
        """The best `top_k` of the source: by vector, by BM25 over `words` (the query's content words,
        letters and digits only, read with each of the text search configurations `lex_configs`), or both
        fused; with `named` (a stretch of time the query names) and a `time_boost`, memories whose fact
        held then rank higher."""
        lexical = bool(words)
        if not (vector or lexical):
            return []
        stmt = _statement(
            source,
            vector,
            lexical,
            user_id is not None,
            agent_id is not None,
            bool(tags),
            threshold is not None,
            fusion,
            include_expired,
            valid_at is not None,
            named is not None and time_boost > 0,
        )
        params: dict[str, Any] = {
            "tenant_id": tenant_id,
            "user_id": user_id,
            "embedding": vector_text(embedding),
            # Each configuration drops its language's stop words and stems the rest; a memory holding
            # any of the lexemes is a candidate.
            "lex_configs": list(lex_configs),
            "lexical_text": " ".join(words),
            "stats_rows": BM25_STATS_ROWS,
            "top_k": top_k,
            "pool": max(pool, top_k),
            "rrf_k": rrf_k,
            "vector_weight": vector_weight,
            "vector_base": vector_base,
            "max_distance": None if threshold is None else 1.0 - threshold,
            "agent_id": agent_id,
            "tags": list(tags),
            "as_of": as_of,
            "valid_at": valid_at,
            "named_from": named[0] if named else None,
            "named_to": named[1] if named else None,
            "time_boost": time_boost,
        }
        rows = await self.session.execute(stmt, params)  # parameters a statement lacks are ignored
        return [_hit(r) for r in rows]

    async def nearest_in_scope(
        self, tenant_id: uuid.UUID, user_id: str, embeddings: Sequence[Sequence[float]], top_k: int
    ) -> list[list[Hit]]:
        """For each vector, the scope's `top_k` nearest active memories, exactly, in one statement (the
        writer's candidates for several texts at once); ordered as `search` orders a vector search."""
        params = {
            "tenant_id": tenant_id,
            "user_id": user_id,
            "embeddings": [vector_text(e) for e in embeddings],
            "top_k": top_k,
        }
        found: list[list[Hit]] = [[] for _ in embeddings]
        for row in await self.session.execute(_NEAREST_IN_SCOPE, params):
            found[row.ord - 1].append(_hit(row))
        return found


def _hit(r: Any) -> Hit:
    return Hit(
        id=r.id,
        user_id=r.user_id,
        agent_id=r.agent_id,
        run_id=r.run_id,
        content=r.content,
        tags=list(r.tags),
        owner=r.owner,
        status=r.status,
        version=r.version,
        memory_at=r.memory_at,
        created_at=r.created_at,
        updated_at=r.updated_at,
        score=float(r.score),
        similarity=None if r.similarity is None else float(r.similarity),
        expires_at=r.expires_at,
        language=r.language,
        valid_from=r.valid_from,
        valid_to=r.valid_to,
    )
