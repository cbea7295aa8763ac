"""Which texts an apply embeds before it locks anything: only those an op may store. An op the
guards are sure to drop, and an UPDATE that repeats what the writer was shown, cost no embedding."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from app.domain.memories.services import ApplyRequest, Provenance, Shown
from app.domain.memories.services.apply import texts_to_embed
from app.writers.base import Op, OpKind

MAY = datetime(2026, 5, 1, tzinfo=UTC)
LYON = Shown(uuid.uuid4(), 3, "The user lives in Lyon.", ("home",), MAY)


def request(*ops: Op, shown: dict[int, Shown] | None = None, at: datetime | None = MAY) -> ApplyRequest:
    return ApplyRequest(
        tenant_id=uuid.uuid4(),
        user_id="u",
        ops=ops,
        shown={0: LYON} if shown is None else shown,
        provenance=Provenance(actor="test"),
        memory_at=at,
    )


def test_ops_that_store_nothing_are_not_embedded() -> None:
    ops = [
        Op(OpKind.NOOP, "The user lives in Lyon."),
        Op(OpKind.DELETE, "The user left Lyon.", (0,)),
        Op(OpKind.UPDATE, "The user lives in Lyon."),  # no target
        Op(OpKind.UPDATE, "The user lives in Nice.", (7,)),  # never shown
        Op(OpKind.ADD, "The user likes tea.", (0,)),  # an ADD takes no target
        Op(OpKind.SUPERSEDE, "The user lives in Rome.", (0, 0)),
        Op(OpKind.ADD, "The user ..."),  # a stand-in
        Op(OpKind.ADD, "   "),
        # Repeats the memory as shown: unchanged, or stale if it changed since
        Op(OpKind.UPDATE, " The user lives in Lyon. ", (0,)),
        Op(OpKind.UPDATE, "The user lives in Lyon.", (0,), tags=("home",)),
    ]
    assert texts_to_embed([request(*ops)]) == []


def test_ops_that_may_store_are_embedded_once_each() -> None:
    ops = [
        Op(OpKind.ADD, "The user likes tea."),
        Op(OpKind.ADD, "The user likes tea."),
        Op(OpKind.SUPERSEDE, "The user lives in Rome.", (0,)),
        # The same content with other tags writes a version: its vector is needed
        Op(OpKind.UPDATE, "The user lives in Lyon.", (0,), tags=("city",)),
    ]
    assert texts_to_embed([request(*ops)]) == [
        "The user likes tea.",
        "The user lives in Rome.",
        "The user lives in Lyon.",
    ]


def test_an_update_that_becomes_an_add_is_embedded() -> None:
    # Older than the memory it would rewrite: kept as a memory of its own (guard `older_fact`).
    older = request(Op(OpKind.UPDATE, "The user lives in Lyon.", (0,)), at=datetime(2026, 1, 1, tzinfo=UTC))
    assert texts_to_embed([older]) == ["The user lives in Lyon."]
    # Shown without its content (a caller that did not have it): embedded, the guards decide later.
    bare = request(Op(OpKind.UPDATE, "The user lives in Lyon.", (0,)), shown={0: Shown(LYON.memory_id, 3)})
    assert texts_to_embed([bare]) == ["The user lives in Lyon."]
