"""apply_ops drops what a writer may not do, records why on the changeset, and writes the rest."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import event, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.db.base import vector_text
from app.db.models import Changeset, Memory
from app.domain.memories.repositories import MemoryRepository, closest_active_statement
from app.domain.memories.services import ApplyLimits, Provenance, Shown, apply_ops
from app.embeddings import HashingEmbedder
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys

EMBEDDER = HashingEmbedder(384)
PROVENANCE = Provenance(actor="test", writer="test")


async def _apply(
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: TenantKeys,
    ops: list[Op],
    shown: dict[int, Shown] | None = None,
    memory_at: datetime | None = None,
) -> tuple[uuid.UUID, list[dict[str, object]]]:
    async with sessionmaker() as session, session.begin():
        outcome = await apply_ops(
            session,
            tenant_id=tenant.tenant_id,
            user_id="u",
            ops=ops,
            shown=shown or {},
            provenance=PROVENANCE,
            embedder=EMBEDDER,
            memory_at=memory_at,
        )
    return outcome.changeset_id, outcome.guards


async def _add_semantically(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys, user: str, contents: list[str]
) -> list[dict[str, object]]:
    """ADDs of `contents` as one writer result, under the default semantic embedder (up to 100 ops)."""
    from tests.support.semantic import semantic_embedder

    async with sessionmaker() as session, session.begin():
        outcome = await apply_ops(
            session,
            tenant_id=tenant.tenant_id,
            user_id=user,
            ops=[Op(OpKind.ADD, c) for c in contents],
            shown={},
            provenance=PROVENANCE,
            embedder=semantic_embedder(),
            limits=ApplyLimits(max_ops=100),
        )
    return outcome.guards


async def _memory(sessionmaker: async_sessionmaker[AsyncSession], content: str) -> Memory:
    async with sessionmaker() as session:
        memory = await session.scalar(select(Memory).where(Memory.content == content))
    assert memory is not None
    return memory


async def test_guards_drop_bad_ops_and_keep_the_bank(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    may_2024 = datetime(2024, 5, 1, tzinfo=UTC)
    await _apply(sessionmaker, tenant, [Op(OpKind.ADD, "The user lives in Lyon.")], memory_at=may_2024)
    lyon = await _memory(sessionmaker, "The user lives in Lyon.")
    shown = {0: Shown(lyon.id, lyon.version)}
    ops = [
        Op(OpKind.SUPERSEDE, "The user lived in Paris.", targets=(0,)),  # older: kept as a past state
        Op(OpKind.DELETE, targets=(7,)),  # an id that was never shown
        Op(OpKind.SUPERSEDE, "The user lives in Rome.", targets=(0, 0)),  # the same memory twice
        Op(OpKind.ADD, "The user lives in Oslo.", targets=(0,)),  # ADD names no targets
        Op(OpKind.UPDATE, "", targets=(0,)),  # empty content
        Op(OpKind.ADD, "The user lives in\x00 Oslo."),  # a NUL, which no Postgres text can hold
    ]
    changeset_id, guards = await _apply(
        sessionmaker, tenant, ops, shown, memory_at=datetime(2022, 1, 1, tzinfo=UTC)
    )
    assert [(g["guard"], g["op_index"]) for g in guards] == [
        ("older_fact", 0),
        ("unknown_id", 1),
        ("bad_targets", 2),
        ("bad_targets", 3),
        ("bad_content", 4),
        ("bad_content", 5),
    ]
    assert "added as a memory of its own" in guards[0]["detail"]
    lyon_now = await _memory(sessionmaker, "The user lives in Lyon.")
    assert (lyon_now.status, lyon_now.version) == ("active", 1)
    # The older fact is not lost: it is a memory of its own, dated when it was said.
    paris = await _memory(sessionmaker, "The user lived in Paris.")
    assert (paris.status, paris.memory_at) == ("active", datetime(2022, 1, 1, tzinfo=UTC))
    async with sessionmaker() as session:
        changeset = await session.get(Changeset, (tenant.tenant_id, changeset_id))
        assert changeset is not None
        assert [(op["op"], op["content"]) for op in changeset.ops] == [("ADD", "The user lived in Paris.")]
        assert [g["guard"] for g in changeset.guards] == [g["guard"] for g in guards]
        assert (
            await session.scalar(
                select(Memory).where(
                    Memory.content.in_(["The user lives in Rome.", "The user lives in Oslo."])
                )
            )
            is None
        )


async def test_stale_target_and_newer_update(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    await _apply(
        sessionmaker,
        tenant,
        [Op(OpKind.ADD, "The user mainly uses Python.")],
        memory_at=datetime(2024, 1, 1, tzinfo=UTC),
    )
    memory = await _memory(sessionmaker, "The user mainly uses Python.")
    later = datetime(2025, 3, 1, tzinfo=UTC)
    _, guards = await _apply(
        sessionmaker,
        tenant,
        [Op(OpKind.UPDATE, "The user mainly uses Rust.", targets=(0,))],
        {0: Shown(memory.id, memory.version)},
        memory_at=later,
    )
    assert guards == []
    updated = await _memory(sessionmaker, "The user mainly uses Rust.")
    assert (updated.version, updated.memory_at) == (2, later)
    # A writer that was shown version 1 cannot change the memory now at version 2.
    _, guards = await _apply(
        sessionmaker, tenant, [Op(OpKind.DELETE, targets=(0,))], {0: Shown(memory.id, 1)}, memory_at=later
    )
    assert [g["guard"] for g in guards] == ["stale_target"]
    assert (await _memory(sessionmaker, "The user mainly uses Rust.")).status == "active"


async def test_the_facts_time_decides_which_is_older_not_the_message_order_alone(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    said_2020, said_2024 = datetime(2020, 1, 5, tzinfo=UTC), datetime(2024, 3, 10, tzinfo=UTC)
    since_2019 = datetime(2019, 1, 1, tzinfo=UTC)
    lyon = Op(OpKind.ADD, "The user lives in Lyon.", valid_from=since_2019)  # "since 2019"
    await _apply(sessionmaker, tenant, [lyon], memory_at=said_2020)
    memory = await _memory(sessionmaker, "The user lives in Lyon.")
    shown = {0: Shown(memory.id, memory.version)}
    # Said later, but about a time before Lyon began: it cannot end Lyon. It is kept as the past state,
    # which held until Lyon began.
    back_then = Op(
        OpKind.SUPERSEDE,
        "The user lived in Paris.",
        targets=(0,),
        valid_from=datetime(2015, 1, 1, tzinfo=UTC),
    )
    _, guards = await _apply(sessionmaker, tenant, [back_then], shown, memory_at=said_2024)
    assert [g["guard"] for g in guards] == ["older_fact"]
    assert (await _memory(sessionmaker, "The user lives in Lyon.")).status == "active"
    paris = await _memory(sessionmaker, "The user lived in Paris.")
    assert (paris.status, paris.valid_from, paris.valid_to) == ("active", back_then.valid_from, since_2019)

    # Said later and about a later time ("last month"): it replaces Lyon, which held until then.
    last_month = datetime(2024, 2, 1, tzinfo=UTC)
    moved = Op(OpKind.SUPERSEDE, "The user lives in Seattle.", targets=(0,), valid_from=last_month)
    _, guards = await _apply(sessionmaker, tenant, [moved], shown, memory_at=said_2024)
    assert guards == []
    memory = await _memory(sessionmaker, "The user lives in Lyon.")
    assert (memory.status, memory.valid_to) == ("superseded", last_month)


async def test_a_fact_whose_beginning_is_unknown_is_replaced_by_what_is_said_after_it(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """'I live in Lyon.', then, the same morning, 'I moved to Seattle last month.': when Lyon began is
    unknown, so the message order decides, and Lyon held until Seattle began."""
    morning, later = datetime(2024, 3, 10, 9, tzinfo=UTC), datetime(2024, 3, 10, 11, tzinfo=UTC)
    await _apply(sessionmaker, tenant, [Op(OpKind.ADD, "The user lives in Lyon.")], memory_at=morning)
    memory = await _memory(sessionmaker, "The user lives in Lyon.")
    last_month = datetime(2024, 2, 1, tzinfo=UTC)
    moved = Op(OpKind.SUPERSEDE, "The user lives in Seattle.", targets=(0,), valid_from=last_month)
    _, guards = await _apply(
        sessionmaker, tenant, [moved], {0: Shown(memory.id, memory.version)}, memory_at=later
    )
    assert guards == []
    memory = await _memory(sessionmaker, "The user lives in Lyon.")
    assert (memory.status, memory.valid_to) == ("superseded", last_month)


async def test_duplicate_check_is_exact_even_when_other_users_crowd_the_vector_index(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """Other users hold 300 memories closer to the text than anything of this user: a filtered walk
    of the tenant-wide HNSW graph (ef_search 40) finds none of this user's rows. The check is planned
    on the scope (never on that graph), even when an ordered index scan looks cheapest, and finds the
    user's own nearest memory."""
    crowded = "The user likes green apples."
    async with sessionmaker() as session, session.begin():
        for i in range(300):
            await apply_ops(
                session,
                tenant_id=tenant.tenant_id,
                user_id=f"other-{i}",
                ops=[Op(OpKind.ADD, f"{crowded} Batch {i}.")],  # distinct vectors, all near the text
                shown={},
                provenance=PROVENANCE,
                embedder=EMBEDDER,
            )
    await _apply(sessionmaker, tenant, [Op(OpKind.ADD, "The user plays the cello on Sundays.")])
    own = await _memory(sessionmaker, "The user plays the cello on Sundays.")
    [vector] = await EMBEDDER.embed([crowded])
    params = {"t0": tenant.tenant_id, "u0": ["u"], "v0": [vector_text(vector)], "o0": [0], "k": 3}
    async with sessionmaker() as session, session.begin():
        # Make an index that returns rows already in distance order look cheapest, as a planner with
        # a large table may well judge it.
        await session.execute(text("SET LOCAL enable_seqscan = off"))
        await session.execute(text("SET LOCAL enable_sort = off"))
        explain = text(f"EXPLAIN {closest_active_statement(1).text}")
        plan = "\n".join((await session.execute(explain, params)).scalars())
        [found] = await MemoryRepository(session).closest_active([(tenant.tenant_id, "u", vector)])
    assert "ix_memories_embedding_hnsw" not in plan
    assert found
    assert found[0][0] == own.id


async def test_a_batch_of_several_tenants_finds_each_ones_own_nearest_in_one_statement(
    sessionmaker: async_sessionmaker[AsyncSession],
    engine: AsyncEngine,
    tenant: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    """The apply's near-duplicate probe for a group commit of two tenants: one statement, and each
    (tenant, user, vector) gets its own scope's memories, in the batch's order, nearest first."""
    await _apply(
        sessionmaker,
        tenant,
        [Op(OpKind.ADD, "The user plays the cello."), Op(OpKind.ADD, "The user likes tea.")],
    )
    await _apply(sessionmaker, other_tenant, [Op(OpKind.ADD, "The user plays the cello on Sundays.")])
    cello, tea = await EMBEDDER.embed(["The user plays the cello.", "The user likes tea."])
    items = [
        (other_tenant.tenant_id, "u", cello),
        (tenant.tenant_id, "u", tea),
        (tenant.tenant_id, "u", cello),
    ]
    statements: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "memories.embedding <=>" in statement:
            statements.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        async with sessionmaker() as session, session.begin():
            found = await MemoryRepository(session).closest_active(items)
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)
    assert len(statements) == 1
    contents = [[content for _, _, content in nearest] for nearest in found]
    assert contents[0] == ["The user plays the cello on Sundays."]  # the other tenant's only
    assert contents[1][0] == "The user likes tea."
    assert contents[2][0] == "The user plays the cello."
    assert set(contents[1]) == set(contents[2]) == {"The user likes tea.", "The user plays the cello."}


async def test_near_duplicates_by_meaning_merge_but_opposites_never_do(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """With the default (semantic) embedder and threshold: a restatement of an active memory is a
    near-duplicate (NOOP); a statement that says its opposite — vectors as close as 0.98 — is stored."""

    async def add(contents: list[str]) -> list[dict[str, object]]:
        return await _add_semantically(sessionmaker, tenant, "u", contents)

    epipen = "allergic to peanuts and carries an EpiPen when travelling abroad."
    await add(["The user likes jazz.", "The user is vegetarian.", f"The user is {epipen}"])
    guards = await add(
        [
            "The user dislikes jazz.",
            "The user is not vegetarian.",
            f"The user isn't {epipen}",  # 0.984 to the active memory: above the threshold
            "The user is a vegetarian.",  # a restatement: 0.996
            "The user likes jazz",
        ]
    )
    assert [(g["guard"], g["op_index"]) for g in guards] == [("near_duplicate", 3), ("near_duplicate", 4)]
    async with sessionmaker() as session:
        active = set(
            await session.scalars(
                select(Memory.content).where(Memory.user_id == "u", Memory.status == "active")
            )
        )
    assert active == {
        "The user likes jazz.",
        "The user dislikes jazz.",
        "The user is vegetarian.",
        "The user is not vegetarian.",
        f"The user is {epipen}",
        f"The user isn't {epipen}",
    }
    # Within one result, too: the second of two opposite ADDs is not taken for a repeat of the first.
    guards = await add(["The user likes opera.", "The user does not like opera.", "The user likes opera!"])
    assert [(g["guard"], g["op_index"]) for g in guards] == [("near_duplicate", 2)]


MINIMAL_PAIRS = [
    ("The user went to a support group on 7 May 2023.", "The user went to a support group on 8 May 2023."),
    ("The user has a dentist appointment on Tuesday.", "The user has a dentist appointment on Thursday."),
    ("The user ran 5 km on Monday.", "The user ran 5 km on Wednesday."),
    ("The user painted a sunrise in 2022.", "The user painted a sunrise in 2023."),
    ("The user's son is 6 years old.", "The user's daughter is 6 years old."),
    ("The user was in Paris in March 2024.", "The user was in Paris in October 2024."),
]


async def test_no_true_fact_is_dropped_as_a_repeat(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    """Two thousand preferences that differ in one made-up word with a number ("I like zor0.",
    ... "I like pemi249."), written a hundred to a result as a writer would, under the default semantic
    embedder and threshold: two thousand memories. The twelve facts of six minimal pairs, all true at
    once: twelve memories. A true repeat: stored once."""

    async def add(contents: list[str]) -> list[dict[str, object]]:
        return await _add_semantically(sessionmaker, tenant, "prefs", contents)

    stems = ["zor", "kali", "bemo", "truff", "savi", "dranel", "oku", "pemi"]
    stream = [f"I like {stem}{n}." for stem in stems for n in range(250)]
    for start in range(0, len(stream), 100):
        assert await add(stream[start : start + 100]) == []
    for first, second in MINIMAL_PAIRS:
        assert await add([first]) == []
        assert await add([second]) == [], second
    guards = await add(["I like zor0.", "The user likes green tea.", "The user likes green tea!"])
    assert [(g["guard"], g["op_index"]) for g in guards] == [("near_duplicate", 0), ("near_duplicate", 2)]
    async with sessionmaker() as session:
        active = list(
            await session.scalars(
                select(Memory.content).where(Memory.user_id == "prefs", Memory.status == "active")
            )
        )
    assert len(active) == len(stream) + 2 * len(MINIMAL_PAIRS) + 1
    assert set(active) >= set(stream) | {fact for pair in MINIMAL_PAIRS for fact in pair}
