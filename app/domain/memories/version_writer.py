"""The one writer of `memories` and `memory_versions`: every statement that inserts or updates a row of
either table is here, so what a write does to a head and to history is read in one place.

Who writes, and with what:

- applying ops (`services.apply`: a writer's results, in a group commit or alone; a hand edit; an
  approved review): `write_applied`: new heads, moved heads and their versions, three bulk
  statements whatever the number of ops and changesets;
- undo (`history`: rollback, revert, restore): `write_restorations`: each memory's next version copied
  from one of its stored versions inside Postgres, and the heads moved to them, two statements for a
  whole bank;
- import (`transfer`): `write_imported`: another instance's heads and versions as they were written;
- re-embedding (`search.reembed`): `write_vectors`: a head's vector, language and lexemes only (a version
  keeps those it was written with).

Every text written here gets its language and lexemes in the same statement (`app.lib.lexical`: the
language detected, the text segmented where its language needs it, `to_tsvector` with the language's
configuration), heads and versions alike, so search's BM25 reads each memory in its own language, and
undo copies a version's lexemes with its text.

No write here inserts into the vector graph: a head written is out of it (`in_graph` false) until the
workers' indexer adds it in a batch (`search.graph`); search reads such rows exactly meanwhile.

Nothing here decides: the callers lock the heads, check them and say what to write; this module says
how, set-wise. It never commits: the caller's transaction makes each write atomic. The service role
may INSERT and UPDATE heads and only INSERT versions (triggers refuse the rest, docs/security.md), so
nothing here deletes; the only deletion of either table is the purge, `memstore_purge_user`, a function
of the tables' owner (`history.repositories`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import bindparam, cast, func, insert, text, update
from sqlalchemy.dialects.postgresql import ARRAY, REGCONFIG, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import Integer, String, Text

from app.db.base import vector_text
from app.domain.memories.repositories import MEMORIES, VERSIONS
from app.lib.lexical import analyze

_m = MEMORIES.c


def _lexemes(prefix: str = "") -> Any:
    """The lexemes of a row's text, computed in the statement that writes it: the configuration and the
    analysed text are the row's parameters `{prefix}lex_config` and `{prefix}lex_text` (`_lexical`)."""
    return func.to_tsvector(cast(bindparam(f"{prefix}lex_config"), REGCONFIG), bindparam(f"{prefix}lex_text"))


_INSERT_HEADS = insert(MEMORIES).values(lexemes=_lexemes())
_INSERT_VERSIONS = insert(VERSIONS).values(lexemes=_lexemes())


@lru_cache(maxsize=4096)
def _analysis(content: str, language: str | None = None) -> dict[str, str]:
    found = analyze(content, language)
    return {"language": found.language, "lex_config": found.config, "lex_text": found.text}


def _lexical(rows: Sequence[dict[str, Any]], prefix: str = "") -> list[dict[str, Any]]:
    """`rows` with their text's language and the parameters of its lexemes (a text met again, such as
    a new head and its first version, is analysed once). A row that names its language (an imported
    one, as its source wrote it) keeps it; the others' is detected."""
    return [
        row
        | {
            f"{prefix}{k}": v
            for k, v in _analysis(row[f"{prefix}content"], row.get(f"{prefix}language")).items()
        }
        for row in rows
    ]


# A head moved to its next version: an UPDATE keeps the old vector (and the memory's date) unless it
# brings a new one; the expiry is always the new version's (NULL clears it). Parameters:
# `MemoryState.change`.
_MOVE_HEADS = (
    update(MEMORIES)
    .where(_m.tenant_id == bindparam("b_tenant_id"), _m.id == bindparam("b_id"))
    .values(
        version=bindparam("b_version"),
        status=bindparam("b_status"),
        content=bindparam("b_content"),
        tags=bindparam("b_tags"),
        changeset_id=bindparam("b_changeset_id"),
        updated_at=func.now(),
        in_graph=False,
        language=bindparam("b_language"),
        lexemes=_lexemes("b_"),
        embedding=func.coalesce(bindparam("b_embedding", type_=_m.embedding.type), _m.embedding),
        memory_at=func.coalesce(bindparam("b_memory_at", type_=_m.memory_at.type), _m.memory_at),
        expires_at=bindparam("b_expires_at", type_=_m.expires_at.type),
        valid_from=bindparam("b_valid_from", type_=_m.valid_from.type),
        valid_to=bindparam("b_valid_to", type_=_m.valid_to.type),
    )
)

# One INSERT ... SELECT writes every new version of a restoration: the state is copied from the
# source version inside Postgres, and `p.status` overrides the status (an undone ADD becomes
# `deleted`). The vector: one the caller embedded afresh (`HistoryRepository.stale_vectors`), else the
# head's own if the text is the head's (it follows a re-embedding), else the one in force at the source
# version. RETURNING, unread: on a Citus cluster an INSERT … SELECT that returns rows is written by INSERT
# on the shards, not by COPY, which row-level security refuses.
_INSERT_RESTORED = text(
    """
    INSERT INTO memory_versions (
        tenant_id, user_id, memory_id, version, op, content, tags, owner, status, memory_at,
        expires_at, valid_from, valid_to, language, lexemes, embedding, changeset_id, actor, reason)
    SELECT tv.tenant_id, tv.user_id, tv.memory_id, p.new_version, :op, tv.content, tv.tags, tv.owner,
           p.status, tv.memory_at, tv.expires_at, tv.valid_from, tv.valid_to, coalesce(tv.language, 'en'),
           coalesce(tv.lexemes, to_tsvector('english'::regconfig, tv.content)),
           COALESCE(CAST(f.vector AS vector), CASE WHEN tv.content = m.content THEN m.embedding END,
               tv.embedding, (
               SELECT e.embedding FROM memory_versions e
               WHERE e.tenant_id = tv.tenant_id AND e.memory_id = tv.memory_id AND e.version < tv.version
                 AND e.embedding IS NOT NULL
               ORDER BY e.version DESC LIMIT 1)),
           :changeset_id, :actor, :reason
    FROM unnest(:memory_ids, :source_versions, :new_versions, :statuses)
         AS p(memory_id, source_version, new_version, status)
    -- LATERAL: one probe of the (tenant_id, memory_id, version) index per row, however long the history.
    CROSS JOIN LATERAL (
        SELECT * FROM memory_versions v
        WHERE v.tenant_id = :tenant_id AND v.memory_id = p.memory_id AND v.version = p.source_version
    ) tv
    JOIN memories m ON m.tenant_id = :tenant_id AND m.id = p.memory_id
    LEFT JOIN unnest(:fresh_ids, :fresh_vectors) AS f(memory_id, vector) ON f.memory_id = p.memory_id
    WHERE tv.tenant_id = :tenant_id AND tv.user_id = :user_id
    RETURNING id
    """
).bindparams(
    bindparam("memory_ids", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("source_versions", type_=ARRAY(Integer)),
    bindparam("new_versions", type_=ARRAY(Integer)),
    bindparam("statuses", type_=ARRAY(String)),
    bindparam("fresh_ids", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("fresh_vectors", type_=ARRAY(String)),
)

# ... and one UPDATE moves the heads to the versions just written under the changeset.
_MOVE_HEADS_TO_CHANGESET = text(
    """
    UPDATE memories m
    SET version = nv.version, status = nv.status, content = nv.content, tags = nv.tags,
        owner = nv.owner, memory_at = nv.memory_at, expires_at = nv.expires_at, embedding = nv.embedding,
        valid_from = nv.valid_from, valid_to = nv.valid_to, language = nv.language, lexemes = nv.lexemes,
        changeset_id = nv.changeset_id, updated_at = now(), in_graph = false
    FROM memory_versions nv
    WHERE nv.tenant_id = :tenant_id AND nv.changeset_id = :changeset_id
      AND m.tenant_id = :tenant_id AND m.id = nv.memory_id
    """
)

# Each vector where its memory still holds the text it was embedded from, with the text's language and
# lexemes as analysed now (a head written before migration 0017 holds English ones); the ids written
# come back. An edit committing meanwhile holds the row until it commits, and the UPDATE then re-checks
# the condition against the edited row.
_WRITE_UNCHANGED = text(
    """
    UPDATE memories m SET embedding = CAST(f.vector AS vector), in_graph = false,
        language = f.language, lexemes = to_tsvector(CAST(f.config AS regconfig), f.lex_text)
    FROM unnest(:ids, :contents, :vectors, :languages, :configs, :lex_texts)
        AS f(id, content, vector, language, config, lex_text)
    WHERE m.tenant_id = :tenant_id AND m.id = f.id AND m.content = f.content
    RETURNING m.id
    """
).bindparams(
    bindparam("ids", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("contents", type_=ARRAY(Text)),
    bindparam("vectors", type_=ARRAY(String)),
    bindparam("languages", type_=ARRAY(String)),
    bindparam("configs", type_=ARRAY(String)),
    bindparam("lex_texts", type_=ARRAY(Text)),
)

# What an imported head may change of one already here (a later export of the same user).
_IMPORTED_CHANGES = (
    "content",
    "language",
    "lexemes",
    "tags",
    "owner",
    "memory_at",
    "expires_at",
    "valid_from",
    "valid_to",
    "status",
    "version",
    "embedding",
    "changeset_id",
    "updated_at",
)


@dataclass(frozen=True)
class Restoration:
    """One memory's next version: the state of `source_version` with `status`."""

    memory_id: uuid.UUID
    source_version: int
    new_version: int
    status: str


class VersionWriter:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def write_applied(
        self,
        new: Sequence[dict[str, Any]],
        moved: Sequence[dict[str, Any]],
        versions: Sequence[dict[str, Any]],
    ) -> None:
        """An apply's rows (`services.rows`): the heads it adds, the heads it moves to their next
        version (`MemoryState.change`), and one version row for each."""
        if new:
            await self.session.execute(_INSERT_HEADS, _lexical(new))
        if moved:
            await (await self.session.connection()).execute(_MOVE_HEADS, _lexical(moved, "b_"))
        if versions:
            await self.session.execute(_INSERT_VERSIONS, _lexical(versions))

    async def write_restorations(
        self,
        *,
        tenant_id: uuid.UUID,
        user_id: str,
        changeset_id: uuid.UUID,
        op: str,
        actor: str,
        reason: str | None,
        restorations: Sequence[Restoration],
        vectors: dict[uuid.UUID, list[float]] | None = None,
    ) -> None:
        """New versions for every restoration and the heads moved to them: two statements in all.
        `vectors`: fresh vectors for some of the memories, instead of the stored ones."""
        if not restorations:
            return
        vectors = vectors or {}
        await self.session.execute(
            _INSERT_RESTORED,
            {
                "tenant_id": tenant_id,
                "user_id": user_id,
                "changeset_id": changeset_id,
                "op": op,
                "actor": actor,
                "reason": reason,
                "memory_ids": [r.memory_id for r in restorations],
                "source_versions": [r.source_version for r in restorations],
                "new_versions": [r.new_version for r in restorations],
                "statuses": [r.status for r in restorations],
                "fresh_ids": list(vectors),
                "fresh_vectors": [vector_text(v) for v in vectors.values()],
            },
        )
        # Through the new versions' changeset index and the primary key: a handful of rows for a
        # revert, the whole bank for a restore, and never a scan of every memory of the tenant.
        await self.session.execute(
            _MOVE_HEADS_TO_CHANGESET, {"tenant_id": tenant_id, "changeset_id": changeset_id}
        )

    async def write_imported(
        self, heads: Sequence[dict[str, Any]], versions: Sequence[dict[str, Any]]
    ) -> tuple[int, int]:
        """Memories and versions of another instance's export (`transfer`), as they were written there.
        Versions already here are left as they are; a head moves only to a later version (a later
        export of the same user). How many heads were written and versions were new."""
        written = 0
        if heads:
            insert_heads = pg_insert(MEMORIES).values(lexemes=_lexemes())
            upsert = insert_heads.on_conflict_do_update(
                index_elements=[_m.tenant_id, _m.id],
                set_={name: insert_heads.excluded[name] for name in _IMPORTED_CHANGES} | {"in_graph": False},
                where=_m.version < insert_heads.excluded.version,
            ).returning(_m.id)
            written = len((await self.session.execute(upsert, _lexical(heads))).all())
        if not versions:
            return written, 0
        new_versions = (
            pg_insert(VERSIONS).values(lexemes=_lexemes()).on_conflict_do_nothing().returning(VERSIONS.c.id)
        )
        return written, len((await self.session.execute(new_versions, _lexical(versions))).all())

    async def write_vectors(
        self, tenant_id: uuid.UUID, texts: dict[uuid.UUID, str], vectors: Sequence[Sequence[float]]
    ) -> set[uuid.UUID]:
        """Each memory's new vector (`search.reembed`), and its language and lexemes analysed again,
        where the memory (of `tenant_id`) still holds the text it was made from (`texts`, in the order
        of `vectors`); the ids written."""
        analysed = [_analysis(content) for content in texts.values()]
        rows = await self.session.execute(
            _WRITE_UNCHANGED,
            {
                "tenant_id": tenant_id,
                "ids": list(texts),
                "contents": list(texts.values()),
                "vectors": [vector_text(v) for v in vectors],
                "languages": [a["language"] for a in analysed],
                "configs": [a["lex_config"] for a in analysed],
                "lex_texts": [a["lex_text"] for a in analysed],
            },
        )
        return set(rows.scalars())
