"""The guards: which of a writer's ops may apply, checked against what it was shown and the memories
as they stand under their locks; which are held for review; and which ADDs only repeat a memory.

A dropped op is recorded on its changeset as a guard (`{"guard", "op_index", "op", "detail"}`), never
raised: one bad op of a result leaves the others to apply. docs/writers.md lists the guards.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np

from app.domain.memories.distinct import content_words, distinct_facts, restates
from app.domain.memories.repositories import MemoryRepository, MemoryState
from app.domain.memories.services.requests import ApplyLimits, ApplyRequest, Shown
from app.writers.base import Op, OpKind, is_placeholder


def guard(guards: list[dict[str, Any]], name: str, index: int, op: Op, detail: str) -> None:
    guards.append({"guard": name, "op_index": index, "op": op.kind.value, "detail": detail})


WRITES_CONTENT = (OpKind.ADD, OpKind.SUPERSEDE, OpKind.UPDATE)


def expiry_after(op: Op, target: MemoryState) -> datetime | None:
    """The expiry an UPDATE of `target` leaves: the op's, none if it clears it, else the target's."""
    if op.expires_at is not None:
        return op.expires_at
    return None if op.clears_expiry else target.expires_at


def fact_time(valid_from: datetime | None, memory_at: datetime | None) -> datetime | None:
    """When a fact began to hold, as far as the bank knows: its valid time, else when it was said."""
    return valid_from if valid_from is not None else memory_at


def older_than(op: Op, memory_at: datetime | None, target: MemoryState) -> bool:
    """Whether an op speaks of an earlier time than `target`, which it would replace: it was said before
    the target was (message order), or both facts' beginnings are known and the op's is earlier. A fact
    whose beginning is unknown is compared by when it was said alone: "I moved to Seattle last month"
    said after "I live in Lyon" replaces Lyon, however recently Lyon was said."""
    if memory_at is not None and target.memory_at is not None and memory_at < target.memory_at:
        return True
    return op.valid_from is not None and target.valid_from is not None and op.valid_from < target.valid_from


def _when(valid_from: datetime | None, memory_at: datetime | None) -> str:
    if valid_from is not None:
        return f"began {valid_from:%Y-%m-%d %H:%M}"
    return f"said {memory_at:%Y-%m-%d %H:%M}" if memory_at is not None else "undated"


def storable(text: str, limits: ApplyLimits) -> bool:
    """Whether `text` (stripped) may be stored as a memory's content."""
    return bool(text) and len(text) <= limits.max_chars and "\x00" not in text


Checked = list[tuple[int, Op, list[MemoryState]]]


def check_ops(  # noqa: PLR0912, PLR0915  (each guard is one branch)
    ops: Sequence[Op],
    shown: dict[int, Shown],
    locked: dict[uuid.UUID, MemoryState],
    guards: list[dict[str, Any]],
    memory_at: datetime | None,
    limits: ApplyLimits,
    held: Checked,
) -> Checked:
    """The ops that may be applied, each with its target memories; those the destructive-ops policy
    holds for review go to `held`; the rest become guards."""
    accepted: Checked = []
    touched: set[uuid.UUID] = set()
    for index, op in enumerate(ops):
        if index >= limits.max_ops:
            guard(guards, "too_many_ops", index, op, f"only the first {limits.max_ops} ops of a result apply")
            continue
        unknown = [t for t in op.targets if t not in shown]
        if unknown:
            guard(guards, "unknown_id", index, op, f"ids {unknown} were not shown to the writer")
            continue
        if op.kind in (OpKind.UPDATE, OpKind.DELETE) and len(op.targets) != 1:
            guard(guards, "bad_targets", index, op, f"{op.kind.value} needs exactly one target")
            continue
        if op.kind is OpKind.SUPERSEDE and not op.targets:
            guard(guards, "bad_targets", index, op, "SUPERSEDE needs at least one target")
            continue
        if op.kind is OpKind.ADD and op.targets:
            guard(guards, "bad_targets", index, op, "ADD takes no targets")
            continue
        if len(set(op.targets)) != len(op.targets):
            guard(guards, "bad_targets", index, op, "an op names the same memory twice")
            continue
        if op.kind in WRITES_CONTENT and not storable((op.content or "").strip(), limits):
            guard(
                guards, "bad_content", index, op, f"content must be 1..{limits.max_chars} characters, no NUL"
            )
            continue
        if op.kind in WRITES_CONTENT and is_placeholder(op.content or ""):
            guard(guards, "placeholder", index, op, "content is a stand-in, not a statement")
            continue
        if op.kind is OpKind.NOOP:
            accepted.append((index, op, []))
            continue
        targets: list[MemoryState] = []
        problem = None
        for local_id in op.targets:
            memory = locked.get(shown[local_id].memory_id)
            if memory is not None and memory.id in touched:
                problem = ("duplicate_target", f"memory {local_id} is already changed by an earlier op")
            elif memory is None or memory.version != shown[local_id].version or memory.status != "active":
                problem = ("stale_target", f"memory {local_id} changed after it was shown to the writer")
            if problem or memory is None:
                break
            targets.append(memory)
        if problem is None and op.kind in (OpKind.UPDATE, OpKind.SUPERSEDE):
            newer = [m for m in targets if older_than(op, memory_at, m)]
            if newer:
                # A statement about an earlier state of affairs never rewrites a newer fact (a late
                # import, a replayed history, "I lived in Paris from 2015" against a fact holding since
                # 2019), and is not lost either: it is kept as a memory of its own, the past state (as
                # the Hy-Memory framework's `enforce_time_order` keeps it), which held until the newer
                # fact began.
                began = fact_time(op.valid_from, memory_at)
                starts = [fact_time(m.valid_from, m.memory_at) for m in newer]
                later = [t for t in starts if t is not None and (began is None or t > began)]
                guard(
                    guards,
                    "older_fact",
                    index,
                    op,
                    f"it speaks of an earlier time ({_when(op.valid_from, memory_at)}) than a memory it "
                    f"would replace ({_when(newer[0].valid_from, newer[0].memory_at)}); added as a memory "
                    "of its own instead",
                )
                ended = op.valid_to or (min(later) if later else None)
                accepted.append((index, replace(op, kind=OpKind.ADD, targets=(), valid_to=ended), []))
                continue
        if problem:
            guard(guards, problem[0], index, op, problem[1])
            continue
        if (
            op.kind is OpKind.UPDATE
            and targets[0].content == (op.content or "").strip()
            and (not op.tags or tuple(op.tags) == targets[0].tags)
            and expiry_after(op, targets[0]) == targets[0].expires_at
        ):
            guard(guards, "unchanged", index, op, "UPDATE repeats the current content")
            continue
        touched.update(m.id for m in targets)
        if op.kind in limits.destructive_kinds and limits.destructive == "deny":
            guard(guards, "denied_op", index, op, f"the policy denies a writer's {op.kind.value}")
        elif op.kind in limits.destructive_kinds and limits.destructive == "review":
            held.append((index, op, targets))  # its guard, naming the review, is recorded with the rows
        else:
            accepted.append((index, op, targets))
    return accepted


@dataclass
class Plan:
    """One request after the guards: the ops that may apply (with their targets) and their vectors."""

    request: ApplyRequest
    accepted: Checked
    guards: list[dict[str, Any]]
    held: Checked = field(default_factory=list)  # ops kept as pending reviews
    vectors: list[list[float]] = field(default_factory=list)  # one per content-writing accepted op
    duplicates: dict[int, tuple[str, str]] = field(default_factory=dict)  # op index -> (of what, why)


async def find_near_duplicates(memories: MemoryRepository, plans: Sequence[Plan]) -> None:
    """Mark ADDs that repeat an active memory of their scope or an earlier ADD of the same result.

    A repeat says the same thing: its vector is at least the threshold similar, or the words that
    carry its fact are the same (`restates`), and it differs from the other in no detail that makes
    another fact (a number, a date, a name, a negation ...: `distinct_facts`). A memory the same result
    replaces or deletes does not count: re-adding it is a correction. One query finds the three
    nearest active memories for every ADD of every plan.
    """
    adds: list[tuple[Plan, int, list[float], str]] = []
    for plan in plans:
        if plan.request.limits.duplicate_threshold > 1.0:  # a threshold above 1 turns the check off
            continue
        vectors = iter(plan.vectors)
        for index, op, _ in plan.accepted:
            if op.kind in WRITES_CONTENT:
                vector = next(vectors)
                if op.kind is OpKind.ADD:
                    adds.append((plan, index, vector, op.content or ""))
    if not adds:
        return
    closest = await memories.closest_active(
        [(p.request.tenant_id, p.request.user_id, vector) for p, _, vector, _ in adds]
    )
    kept: dict[int, _KeptAdds] = {}  # per plan: ADDs that stay
    for (plan, index, vector, content), nearest in zip(adds, closest, strict=True):
        threshold = plan.request.limits.duplicate_threshold_for(content)
        replaced = {m.id for _, op, targets in plan.accepted if op.kind is not OpKind.UPDATE for m in targets}
        twin = next(
            (
                (memory_id, similarity)
                for memory_id, similarity, text_ in nearest
                if memory_id not in replaced and repeats(content, text_, similarity, threshold)
            ),
            None,
        )
        if twin is not None:
            plan.duplicates[index] = (
                str(twin[0]),
                f"repeats active memory {twin[0]} (similarity {twin[1]:.3f})",
            )
            continue
        earlier = kept.setdefault(id(plan), _KeptAdds())
        same = earlier.first_repeat(content, vector, threshold)
        if same is not None:
            plan.duplicates[index] = (f"op:{same}", f"repeats op {same} of the same result")
            continue
        earlier.keep(index, vector, content)


def repeats(content: str, other: str, similarity: float, threshold: float) -> bool:
    """Whether an ADD of `content` only repeats `other` (cosine `similarity` apart)."""
    return (similarity >= threshold or restates(content, other)) and distinct_facts(content, other) is None


class _KeptAdds:
    """The ADDs of one result that stay, in order, for the later ADDs of that result to be compared
    with: `repeats` against each, found with one matrix product and one lookup by words, not a loop
    over pairs (a result of a thousand ADDs made half a million comparisons in Python)."""

    def __init__(self) -> None:
        self._indexes: list[int] = []
        self._contents: list[str] = []
        self._units = np.empty((0, 0))  # their unit vectors, one per row; rows past the count are room
        self._by_words: dict[frozenset[str], list[int]] = {}  # what `restates` compares -> positions

    def first_repeat(self, content: str, vector: Sequence[float], threshold: float) -> int | None:
        """The op index of the first kept ADD that `content` repeats, if any."""
        count = len(self._indexes)
        if not count:
            return None
        similar = np.flatnonzero(self._units[:count] @ _unit(vector) >= threshold).tolist()
        same_words = self._by_words.get(content_words(content), [])
        for position in sorted({*similar, *same_words}):
            if distinct_facts(content, self._contents[position]) is None:
                return self._indexes[position]
        return None

    def keep(self, index: int, vector: Sequence[float], content: str) -> None:
        count = len(self._indexes)
        if count == len(self._units):
            grown = np.empty((max(8, 2 * count), len(vector)))
            if count:
                grown[:count] = self._units
            self._units = grown
        self._units[count] = _unit(vector)
        self._indexes.append(index)
        self._contents.append(content)
        if words := content_words(content):  # no words restate nothing
            self._by_words.setdefault(words, []).append(count)


def _unit(vector: Sequence[float]) -> np.ndarray:
    """`vector` scaled to length 1 (zeros stay zeros: similar to nothing)."""
    array = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(array))
    return array / norm if norm else array
