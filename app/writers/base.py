"""The writer seam: what a writer is shown, and what it may answer.

A writer never sees database ids. Existing memories are shown as `Candidate`s under short local ids
(0, 1, 2 ... in the order given), and ops name targets by those ids; the apply step maps them back
and drops anything that names an id it did not show (architecture invariant 5).

What a model writes may hold characters no Postgres text can (NUL, and the lone UTF-16 surrogates that
a JSON escape such as `\\ud800` decodes to); `storable_ops` takes them out of the ops' text before
anything is written, so such an answer costs one guard, not the chunk. Small models also fill the
template in: "The user ...", "...", a bare timestamp; `is_placeholder` tells such content from a
statement, for the apply step's `placeholder` guard.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)


class OpKind(StrEnum):
    ADD = "ADD"  # a new memory
    UPDATE = "UPDATE"  # rewrite one existing memory (a lossless merge or correction)
    SUPERSEDE = "SUPERSEDE"  # a new memory replaces older ones, which become `superseded`
    DELETE = "DELETE"  # an existing memory is no longer true
    NOOP = "NOOP"  # nothing to change (recorded so the changeset says why)


# What a writer's destructive ops meet (settings `destructive_ops`, per tenant and per writer): applied,
# held for a human as a pending review, or dropped; and which ops are destructive unless said otherwise.
DESTRUCTIVE_POLICIES = ("allow", "review", "deny")
DEFAULT_DESTRUCTIVE_KINDS = frozenset({OpKind.DELETE, OpKind.SUPERSEDE})


def strictest(*policies: str | None) -> str:
    """The strictest of the named policies (deny > review > allow); `allow` if none is named."""
    named = [p for p in policies if p]
    return max(named, key=DESTRUCTIVE_POLICIES.index) if named else "allow"


@dataclass(frozen=True)
class Message:
    role: str  # user | assistant | system | tool
    content: str
    name: str | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class Candidate:
    """An existing memory of the scope, as the writer sees it."""

    local_id: int
    content: str
    tags: tuple[str, ...] = ()
    owner: str = "user"
    memory_at: datetime | None = None
    created_at: datetime | None = None  # when it was first written (not shown; orders undated ones)


@dataclass(frozen=True)
class CandidateQuery:
    """How a protocol picks the existing memories it shows for the texts it extracted: the
    `per_text` most similar to each text, those at least `min_score` similar (cosine), and of the
    union at most `total`, the most similar first. Kept in the order they were found."""

    per_text: int = 10
    min_score: float | None = None
    total: int | None = None


def select_candidates(found: Sequence[Sequence[tuple[K, float]]], query: CandidateQuery) -> list[K]:
    """The keys `query` keeps of each text's ranked (key, similarity) hits, in the order first found."""
    best: dict[K, float] = {}
    for hits in found:
        for key, score in list(hits)[: query.per_text]:
            if query.min_score is not None and score < query.min_score:
                continue
            best[key] = max(best.get(key, score), score)
    if query.total is None or len(best) <= query.total:
        return list(best)
    kept = set(sorted(best, key=lambda k: -best[k])[: query.total])  # sorted() is stable: ties keep order
    return [key for key in best if key in kept]


# More candidates for the given query texts (two-phase writers: extract, then retrieve, then reconcile),
# picked as the query says. Candidates already shown keep their local id; new ones get the next free ids.
# No query: the deployment's `MEMSTORE_CANDIDATE_LIMIT` per text, no floor, no cap.
CandidateSearch = Callable[[list[str], "CandidateQuery | None"], Awaitable[tuple[Candidate, ...]]]


@dataclass(frozen=True)
class WriteRequest:
    """Everything a writer may use to decide; nothing outside the scope is in here."""

    user_id: str
    messages: tuple[Message, ...]  # the chunk being written
    context: tuple[Message, ...]  # the scope's last k messages before this chunk, oldest first
    candidates: tuple[Candidate, ...]  # related memories of the scope, local ids 0..n-1
    memory_at: datetime  # when the chunk's conversation happened
    now: datetime  # the current date, for resolving "last month" etc.
    agent_id: str | None = None
    run_id: str | None = None
    search: CandidateSearch | None = field(default=None, compare=False, repr=False)

    async def related(self, queries: list[str], query: CandidateQuery | None = None) -> tuple[Candidate, ...]:
        """The memories `search` finds for `queries` as `query` picks them, in the order found, then
        any candidates shown up front that it did not find."""
        if self.search is None:
            return self.candidates
        found = await self.search(queries, query)
        seen = {c.local_id for c in found}
        return (*found, *(c for c in self.candidates if c.local_id not in seen))


@dataclass(frozen=True)
class Op:
    """One decision. `targets` are candidate local ids: one for UPDATE / DELETE, one or more for
    SUPERSEDE (oldest first), none for ADD / NOOP."""

    kind: OpKind
    content: str | None = None
    targets: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    owner: str = "user"
    reason: str | None = None
    # ADD / SUPERSEDE / UPDATE: when the memory stops being shown (a dated plan's end); None keeps an
    # UPDATE's target's expiry, unless `clears_expiry` (a hand edit's `"expires_at": null`).
    expires_at: datetime | None = None
    clears_expiry: bool = False
    # ADD / SUPERSEDE / UPDATE: when the fact began and stopped holding in the user's world, where the
    # conversation says (valid time); None: unknown (an UPDATE keeps its target's).
    valid_from: datetime | None = None
    valid_to: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        recorded: dict[str, Any] = {
            "op": self.kind.value,
            "content": self.content,
            "targets": list(self.targets),
            "tags": list(self.tags),
            "owner": self.owner,
            "reason": self.reason,
        }
        if self.expires_at is not None or self.clears_expiry:  # only ops that set or clear one say so
            recorded["expires_at"] = None if self.expires_at is None else self.expires_at.isoformat()
        for name in ("valid_from", "valid_to"):  # only ops that know one say so
            moment = getattr(self, name)
            if moment is not None:
                recorded[name] = moment.isoformat()
        return recorded


@dataclass
class WriteResult:
    """A writer's answer with what is needed to audit it later."""

    ops: list[Op]
    raw_output: str | None = None  # exactly what the model returned (None for non-LLM writers)
    prompt_hash: str | None = None  # hash of the prompt template(s) used
    usage: dict[str, Any] = field(default_factory=dict)  # tokens, latency
    # What the writer itself dropped from the model's answer (an unknown op, an invented id), recorded
    # on the changeset beside the guards the apply step adds.
    guards: list[dict[str, Any]] = field(default_factory=list)


# NUL, and any surrogate code point (in a Python str from JSON, a surrogate is always a lone one: a
# valid pair decodes to the character it encodes); UTF-8, and so Postgres, has no encoding for either.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """`text` without the characters Postgres text cannot hold."""
    return _UNSTORABLE.sub("", text)


def storable_ops(ops: list[Op]) -> tuple[list[Op], list[dict[str, Any]]]:
    """The ops with their content, tags and reason made storable, and a `unstorable_text` guard for
    each op that held something else. An op keeps its place (the apply step's guards refer to ops by
    index); one whose content is left empty is then dropped there as `bad_content`."""
    clean: list[Op] = []
    guards: list[dict[str, Any]] = []
    for index, op in enumerate(ops):
        texts = [op.content or "", op.reason or "", *op.tags]
        removed = sum(len(_UNSTORABLE.findall(text)) for text in texts)
        if not removed:
            clean.append(op)
            continue
        tags = tuple(tag for tag in map(storable_text, op.tags) if tag.strip())
        content = storable_text(op.content) if op.content is not None else None
        reason = storable_text(op.reason) if op.reason is not None else None
        clean.append(replace(op, content=content, tags=tags, reason=reason or None))
        guards.append(
            {
                "guard": "unstorable_text",
                "op_index": index,
                "op": op.kind.value,
                "detail": f"removed {removed} character(s) no Postgres text can hold (NUL, lone surrogates)",
            }
        )
    return clean, guards


# An ellipsis standing in for the rest: at the end, alone or after a space ("The user ...", "lives in
# [...]"), not one that trails off a word ("thinking of moving to Berlin...").
_STAND_IN_ELLIPSIS = re.compile(r"(?:^|\s)[\[(<\"'\u201c]?(?:\.{2,}|\u2026)[\])>\"'\u201d]?[\s.!?]*$")
_TEMPLATE_SLOT = re.compile(r"[<\[{][^<>\[\]{}]*[>\]}]")  # "<memory>", "[content]", "{value}"
_BARE_SUBJECT = re.compile(r"(?:the\s+)?(?:user|agent|assistant)(?:['\u2019]s)?", re.IGNORECASE)
_STAND_IN_WORDS = frozenset({"n/a", "none", "null", "unknown", "tbd", "todo", "placeholder", "etc"})
_CALENDAR_NAMES = frozenset(
    {
        *("january", "february", "march", "april", "may", "june", "july", "august", "september"),
        *("october", "november", "december", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep"),
        *("sept", "oct", "nov", "dec", "monday", "tuesday", "wednesday", "thursday", "friday"),
        *("saturday", "sunday", "mon", "tue", "tues", "wed", "thu", "thur", "thurs", "fri", "sat", "sun"),
    }
)
# What else a date or time is written with: "1st of November 2026 at 10:00 AM", "2026-11-01T10:00Z".
_DATE_WORDS = _CALENDAR_NAMES | frozenset(("am", "pm", "at", "on", "of", "the", "t", "z", "utc", "gmt"))
_ORDINALS = frozenset(("st", "nd", "rd", "th"))
_EDGES = re.compile(r"^[\W_]+|[\W_]+$")


def is_placeholder(text: str) -> bool:
    """Whether `text` stands in for a statement instead of making one: only punctuation or an
    ellipsis, a trailing "..." in place of the rest, a template slot, a bare date or time, or a
    subject with nothing said about it ("The user", "User ...")."""
    stripped = text.strip()
    if not any(c.isalnum() for c in stripped):
        return True
    if _STAND_IN_ELLIPSIS.search(stripped) or stripped.endswith(":") or _TEMPLATE_SLOT.fullmatch(stripped):
        return True
    core = _EDGES.sub("", stripped)
    if _BARE_SUBJECT.fullmatch(core) or core.lower() in _STAND_IN_WORDS:
        return True
    words = re.findall(r"[^\W\d_]+", core.lower())
    dated = any(c.isdigit() for c in core) or any(w in _CALENDAR_NAMES for w in words)
    return dated and all(w in _DATE_WORDS or w in _ORDINALS for w in words)


class WriterError(Exception):
    """The writer failed for this chunk (timeout, garbage output ...); the chunk may be retried.

    `attempt_limit` caps the chunk's attempts for this kind of failure below MEMSTORE_MAX_ATTEMPTS
    (a model that answered garbage twice will not do better a fifth time). `usage` is what the calls
    made before the failure cost, in `WriteResult.usage`'s keys (empty if none was made).
    """

    def __init__(
        self,
        message: str,
        raw_output: str | None = None,
        attempt_limit: int | None = None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.raw_output = raw_output
        self.attempt_limit = attempt_limit
        self.usage: dict[str, Any] = usage or {}


class Writer(Protocol):
    """Anything that turns a `WriteRequest` into ops. Implementations must be safe to call concurrently."""

    name: str  # the configured name ("default", "hy-memory-prod" ...)
    model: str | None  # the model behind it, if any
    profile: str | None  # the protocol spoken to the model (hy-memory, mem0, mem0-v3, memos, simple), if any
    # How many earlier messages of the scope it wants as context; None: MEMSTORE_CONTEXT_MESSAGES.
    context_messages: int | None
    # Whether to be shown memories related to the whole chunk up front (False: it calls `search` itself).
    initial_candidates: bool

    async def write(self, request: WriteRequest) -> WriteResult: ...
