"""Memories: the head (current state) of each memory. Its past lives in `memory_versions`."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, TSVECTOR, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.config import get_settings
from app.db.base import Base, Embedding, tenant_key, timestamp_column, uuid_id

MEMORY_STATUSES = ("active", "superseded", "deleted")
MEMORY_OWNERS = ("user", "agent")
# HNSW build parameters of the cross-scope index (migration 0002); docs/benchmarks.md has their figures.
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 128


class Memory(Base):
    """One remembered fact of a scope, as it stands now."""

    __tablename__ = "memories"
    __table_args__ = (
        tenant_key(),
        # Scoped reads and exact search walk this B-tree: a user's active memories, nothing else.
        Index("ix_memories_scope", "tenant_id", "user_id", "status"),
        # Cross-scope and very large scopes: approximate search over current memories only, so
        # superseded and deleted rows neither take graph slots nor come back from a scan. Only rows
        # the indexer has marked (`in_graph`): a write never pays for a graph insert (migration 0011).
        Index(
            "ix_memories_embedding_hnsw",
            "embedding",
            postgresql_using="hnsw",
            postgresql_with={"m": HNSW_M, "ef_construction": HNSW_EF_CONSTRUCTION},
            postgresql_ops={"embedding": "vector_cosine_ops"},
            postgresql_where=text("status = 'active' AND in_graph"),
        ),
        # ... and the active rows not in the graph yet, which search reads exactly beside it.
        Index(
            "ix_memories_graph_tail",
            "tenant_id",
            "user_id",
            postgresql_where=text("status = 'active' AND NOT in_graph"),
        ),
        # Lexical half of hybrid search: which active memories hold a query's lexemes.
        Index(
            "ix_memories_lexemes",
            "lexemes",
            postgresql_using="gin",
            postgresql_where=text("status = 'active'"),
        ),
        CheckConstraint(f"status IN {MEMORY_STATUSES!r}", name="status"),
        CheckConstraint(f"owner IN {MEMORY_OWNERS!r}", name="owner"),
    )

    id: Mapped[uuid.UUID] = uuid_id()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False)
    user_id: Mapped[str] = mapped_column(String(200), nullable=False)
    agent_id: Mapped[str | None] = mapped_column(String(200))
    run_id: Mapped[str | None] = mapped_column(String(200))
    content: Mapped[str] = mapped_column(Text, nullable=False)
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default=text("'{}'"))
    owner: Mapped[str] = mapped_column(String(16), nullable=False, server_default="user")
    memory_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # From this time on the memory is hidden from list, search, answer and the writer's candidates
    # (never deleted: its status stays); NULL never expires (migration 0016).
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the fact held in the user's world (valid time, migration 0018): NULL where unknown; a fact
    # without `valid_from` is taken to hold from when it was stated (`memory_at`).
    valid_from: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    valid_to: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16), nullable=False, server_default="active")
    version: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    embedding: Mapped[list[float] | None] = mapped_column(Embedding(get_settings().embedding_dim))
    # The content's language (ISO 639-1, detected when the text is written: `app.lib.lexical`) and its
    # lexemes in that language (stemmed where Postgres has the language's Snowball configuration,
    # segmented first for Chinese and Japanese), written with the text by `memories.version_writer`:
    # BM25 reads their frequencies and counts on every lexical search. Not loaded with the row.
    language: Mapped[str] = mapped_column(String(8), nullable=False, server_default="en")
    lexemes: Mapped[str | None] = mapped_column(TSVECTOR, deferred=True)
    # Whether this row version is in the HNSW graph: set by the indexer (`memstore_index_graph`), false
    # again whenever the head is written, so that the write inserts into no graph.
    in_graph: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    # The changeset that wrote the current version (the revert conflict check reads it).
    changeset_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    created_at: Mapped[datetime] = timestamp_column()
    updated_at: Mapped[datetime] = timestamp_column()
