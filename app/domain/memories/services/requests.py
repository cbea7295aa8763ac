"""What an apply is asked and what it answers: the ops of one changeset (`ApplyRequest`), what the
writer was shown (`Shown`), who and what produced them (`Provenance`), the bounds they are held to
(`ApplyLimits`), and the outcome (`ApplyOutcome`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app.lib.lexical import detect
from app.writers.base import DEFAULT_DESTRUCTIVE_KINDS, Op, OpKind

MAX_MEMORY_CHARS = 2_000


@dataclass(frozen=True)
class Shown:
    """A memory as it was when shown to the writer under a local id (its content, tags and date when
    the caller had them: `texts_to_embed` leaves out an UPDATE that repeats them)."""

    memory_id: uuid.UUID
    version: int
    content: str | None = None
    tags: tuple[str, ...] = ()
    memory_at: datetime | None = None


@dataclass(frozen=True)
class Provenance:
    """Who and what produced a changeset (architecture invariant 6)."""

    actor: str
    kind: str = "writer"
    writer: str | None = None
    model: str | None = None
    profile: str | None = None
    prompt_hash: str | None = None
    chunk_id: uuid.UUID | None = None
    reason: str | None = None


@dataclass(frozen=True)
class ApplyLimits:
    """Bounds on what one writer result may do (see MEMSTORE_WRITER_MAX_OPS and the settings after it)."""

    max_ops: int = 50
    max_chars: int = MAX_MEMORY_CHARS
    # An ADD at least this similar (cosine) to an active memory of the scope, or to another ADD of the
    # same result, stores nothing: over-storing near-copies is a known failure of memory writers.
    duplicate_threshold: float = 0.95
    # The embedder's own thresholds by language (`embeddings.base.DUPLICATE_THRESHOLDS`), which raise it.
    duplicate_thresholds: Mapping[str, float] = field(default_factory=dict)
    # Under `review` an op of these kinds that passes every guard is held as a pending review instead
    # of applied; under `deny` it is dropped (guard `denied_op`). Hand edits and approvals use `allow`.
    destructive: str = "allow"
    destructive_kinds: frozenset[OpKind] = DEFAULT_DESTRUCTIVE_KINDS

    def duplicate_threshold_for(self, content: str) -> float:
        """The near-duplicate threshold of an ADD of `content`: `duplicate_threshold`, raised to the
        embedder's own for the content's language (the strictest it has for a language not measured)."""
        if not self.duplicate_thresholds or self.duplicate_threshold > 1.0:
            return self.duplicate_threshold
        own = self.duplicate_thresholds.get(detect(content), max(self.duplicate_thresholds.values()))
        return max(self.duplicate_threshold, own)


@dataclass
class ApplyOutcome:
    changeset_id: uuid.UUID
    applied: int = 0
    guards: list[dict[str, Any]] = field(default_factory=list)
    reviews: list[uuid.UUID] = field(default_factory=list)  # ops held for a human (policy `review`)


# Text -> its vector, embedded before the apply's transaction (see `embed_ops`).
Vectors = Mapping[str, Sequence[float]]


@dataclass(frozen=True)
class ApplyRequest:
    """One changeset's worth of ops for one scope: what `apply_many` writes, with why and by whom."""

    tenant_id: uuid.UUID
    user_id: str
    ops: Sequence[Op]
    shown: dict[int, Shown]
    provenance: Provenance
    agent_id: str | None = None
    run_id: str | None = None
    memory_at: datetime | None = None
    raw_output: str | None = None
    usage: dict[str, Any] | None = None
    guards: Sequence[dict[str, Any]] = ()
    changeset_id: uuid.UUID = field(default_factory=uuid.uuid4)
    limits: ApplyLimits = field(default_factory=ApplyLimits)
    # When the memories this request adds expire, unless their op says (a chunk's expiration date).
    expires_at: datetime | None = None
