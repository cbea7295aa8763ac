"""Which texts an apply embeds before it locks anything: only those an op may store. An op the
guards are sure to drop, and an UPDATE that repeats what the writer was shown, cost no embedding."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.memories.repositories import MemoryState
from app.domain.memories.services import ApplyRequest, Provenance, Shown
from app.domain.memories.services.apply import texts_to_embed
from app.domain.memories.services.guards import WRITES_CONTENT, Checked, check_ops
from app.writers.base import Op, OpKind

MAY = datetime(2026, 5, 1, tzinfo=UTC)
SEPTEMBER = datetime(2026, 9, 1, tzinfo=UTC)
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
    ]
    # The same content with other tags writes a version: its vector is needed (in a result of its own:
    # after the SUPERSEDE above, a second op on memory 0 is dropped, `duplicate_target`).
    retag = Op(OpKind.UPDATE, "The user lives in Lyon.", (0,), tags=("city",))
    assert texts_to_embed([request(*ops), request(retag)]) == [
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


def test_an_op_freed_under_the_locks_by_a_stale_one_is_embedded() -> None:
    # A SUPERSEDE of memories 0 and 1, then an UPDATE of memory 1: as shown, the UPDATE is dropped (a
    # second op on memory 1). Memory 0 changed since it was shown: under the locks the SUPERSEDE is
    # dropped (`stale_target`), and the UPDATE stands, so its text must be embedded beforehand.
    lyon = Shown(uuid.uuid4(), 3, "The user lives in Lyon.", (), None)
    oslo = Shown(uuid.uuid4(), 3, "The user lives in Oslo.", (), None)
    apply = request(
        Op(OpKind.SUPERSEDE, "The user lives in Oslo.", (0, 1)),
        Op(OpKind.UPDATE, "The user lives in Lyon.", (1,)),
        shown={0: lyon, 1: oslo},
        at=None,
    )
    locked = {
        lyon.memory_id: MemoryState(lyon.memory_id, 4, "active", "The user lives in Lyon.", (), "user", None),
        oslo.memory_id: MemoryState(oslo.memory_id, 3, "active", "The user lives in Oslo.", (), "user", None),
    }
    accepted = check_ops(apply.ops, apply.shown, locked, [], apply.memory_at, apply.limits, [])
    assert [op.kind for _, op, _ in accepted] == [OpKind.UPDATE]
    assert "The user lives in Lyon." in texts_to_embed([apply])


# Every op the guards accept with content has its text embedded beforehand: `texts_to_embed` may leave
# out only what `check_ops` drops, or the apply would fail for want of a vector. Checked against the
# guards themselves, over generated ops and memories as they were shown and as they stand locked.
_CONTENTS = ["The user lives in Lyon.", "The user lives in Oslo.", "  The user lives in Lyon.  ", "", "..."]
_TAGS = [(), ("home",), ("work",)]


@st.composite
def _cases(draw: st.DrawFn) -> tuple[ApplyRequest, dict[uuid.UUID, MemoryState]]:
    shown: dict[int, Shown] = {}
    locked: dict[uuid.UUID, MemoryState] = {}
    for local_id in range(draw(st.integers(0, 3))):
        memory_id = uuid.uuid4()
        content = draw(st.sampled_from(_CONTENTS[:2]))
        tags = draw(st.sampled_from(_TAGS))
        when = draw(st.sampled_from([None, MAY, SEPTEMBER, SEPTEMBER]))
        shown[local_id] = Shown(memory_id, 3, content, tags, when)
        # As it stands under its lock: unchanged (most often), changed since it was shown, or gone.
        version = draw(st.sampled_from([3, 3, 3, 4, None]))
        if version is not None:
            locked[memory_id] = MemoryState(memory_id, version, "active", content, tags, "user", when)
    ops = draw(
        st.lists(
            st.builds(
                Op,
                st.sampled_from([*OpKind, OpKind.UPDATE, OpKind.UPDATE]),
                st.sampled_from([*_CONTENTS, _CONTENTS[0], _CONTENTS[0], None]),
                st.lists(st.integers(0, 3), max_size=2).map(tuple),
                st.sampled_from([(), ("home",), ("work",)]),
            ),
            max_size=6,
        )
    )
    at = draw(st.sampled_from([None, MAY, MAY, datetime(2026, 7, 1, tzinfo=UTC)]))
    return request(*ops, shown=shown, at=at), locked


@settings(max_examples=1000, deadline=None)
@given(_cases())
def test_every_op_the_guards_accept_with_content_has_its_text_embedded(
    case: tuple[ApplyRequest, dict[uuid.UUID, MemoryState]],
) -> None:
    apply, locked = case
    held: Checked = []
    accepted = check_ops(apply.ops, apply.shown, locked, [], apply.memory_at, apply.limits, held)
    embedded = set(texts_to_embed([apply]))
    for _, op, _ in [*accepted, *held]:
        if op.kind in WRITES_CONTENT:
            assert (op.content or "").strip() in embedded, (op, apply.shown, locked)
