"""Property: over random sequences of writer changesets, hand edits and deletes, rollbacks, reverts
and restores, the bank and every memory's history match a simple in-memory model after every step.

The model states the rules of undo plainly: a rollback takes a stored version's state; a revert takes
each memory back to its state before the changeset (an ADD to `deleted`), refusing (409) when a later
changeset touched it unless forced; a restore gives each memory its state at a time (`deleted` if it
was created later). Dry runs change nothing and announce the diff the real run then makes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Memory, MemoryVersion
from app.domain.history import services as history
from app.domain.memories import services as memories
from app.domain.memories.repositories import MemoryRepository
from app.domain.memories.services import ApplyLimits, Provenance, Shown, apply_ops
from app.lib.errors import ConflictError
from app.writers.base import Op, OpKind
from tests.conftest import TenantKeys
from tests.support.history import EMBEDDER, db_now

T = TypeVar("T")
State = tuple[str, str]  # (content, status)
WHO = history.Actor("key:property-test", None, "property")
# Contents are unique by construction; the near-duplicate guard is about writers, not undo.
LIMITS = ApplyLimits(duplicate_threshold=1.01)

KINDS = st.sampled_from([OpKind.ADD, OpKind.UPDATE, OpKind.DELETE, OpKind.SUPERSEDE])
PICK = st.integers(0, 1_000)
WRITE = st.tuples(st.just("write"), st.lists(st.tuples(KINDS, PICK), min_size=1, max_size=2))
STEPS = st.one_of(
    WRITE,
    WRITE,  # twice as likely as each other step, so banks grow and undo has something to work on
    st.tuples(st.just("edit"), PICK),
    st.tuples(st.just("delete"), PICK),
    st.tuples(st.just("rollback"), PICK, PICK, st.booleans()),
    st.tuples(st.just("revert"), PICK, st.booleans(), st.booleans()),
    st.tuples(st.just("restore"), PICK, st.booleans()),
)


@dataclass
class ModelChangeset:
    id: uuid.UUID
    touches: dict[uuid.UUID, int]  # memory -> the version this changeset wrote
    before: dict[uuid.UUID, State | None]  # each memory's state before it (None: it did not exist)
    status: str = "applied"


@dataclass
class Model:
    history: dict[uuid.UUID, list[State]] = field(default_factory=dict)
    changesets: list[ModelChangeset] = field(default_factory=list)
    checkpoints: list[tuple[datetime, dict[uuid.UUID, int]]] = field(default_factory=list)
    counter: int = 0

    def head(self, memory_id: uuid.UUID) -> State:
        return self.history[memory_id][-1]

    def active(self) -> list[uuid.UUID]:
        return [m for m in self.history if self.head(m)[1] == "active"]

    def content(self) -> str:
        self.counter += 1
        return f"Fact {self.counter} {uuid.uuid4().hex[:6]}"

    def apply(self, changeset_id: uuid.UUID | None, targets: dict[uuid.UUID, State]) -> int:
        """Give each memory its target state (a new version where it differs); record the changeset."""
        touches, before = {}, {}
        for memory_id, state in targets.items():
            past = self.history.setdefault(memory_id, [])
            if past and past[-1] == state:
                continue
            before[memory_id] = past[-1] if past else None
            past.append(state)
            touches[memory_id] = len(past)
        if touches:
            assert changeset_id is not None
            self.changesets.append(ModelChangeset(changeset_id, touches, before))
        return len(touches)


def _run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


async def _db_bank(
    sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, user_id: str
) -> tuple[dict[uuid.UUID, tuple[str, str, int]], dict[uuid.UUID, list[State]]]:
    async with sessionmaker() as session:
        heads = (
            await session.execute(
                select(Memory.id, Memory.content, Memory.status, Memory.version).where(
                    Memory.tenant_id == tenant_id, Memory.user_id == user_id
                )
            )
        ).all()
        versions = (
            await session.execute(
                select(MemoryVersion.memory_id, MemoryVersion.content, MemoryVersion.status)
                .where(MemoryVersion.tenant_id == tenant_id, MemoryVersion.user_id == user_id)
                .order_by(MemoryVersion.memory_id, MemoryVersion.version)
            )
        ).all()
    past: dict[uuid.UUID, list[State]] = {}
    for memory_id, content, status in versions:
        past.setdefault(memory_id, []).append((content, status))
    return {m: (c, s, v) for m, c, s, v in heads}, past


class Steps:
    """Runs each step against the service and the model; the checks run after every step."""

    def __init__(
        self, sessionmaker: async_sessionmaker[AsyncSession], tenant_id: uuid.UUID, user_id: str
    ) -> None:
        self.sessionmaker = sessionmaker
        self.tenant_id = tenant_id
        self.user_id = user_id
        self.model = Model()

    async def _in_tx(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        async with self.sessionmaker() as session, session.begin():
            return await work(session)

    async def write(self, items: list[tuple[OpKind, int]]) -> None:
        model, ops, shown, targets, adds = self.model, [], {}, {}, []
        for wanted, pick in items:
            free = [m for m in model.active() if m not in targets]
            kind = wanted if free else OpKind.ADD
            content = model.content()
            if kind is OpKind.ADD:
                ops.append(Op(kind, content))
                adds.append(content)
                continue
            memory_id = free[pick % len(free)]
            local = len(shown)
            shown[local] = Shown(memory_id, len(model.history[memory_id]))
            old = model.head(memory_id)[0]
            if kind is OpKind.UPDATE:
                ops.append(Op(kind, content, (local,)))
                targets[memory_id] = (content, "active")
            elif kind is OpKind.DELETE:
                ops.append(Op(kind, targets=(local,)))
                targets[memory_id] = (old, "deleted")
            else:
                ops.append(Op(kind, content, (local,)))
                targets[memory_id] = (old, "superseded")
                adds.append(content)

        async def apply(session: AsyncSession) -> memories.ApplyOutcome:
            return await apply_ops(
                session,
                tenant_id=self.tenant_id,
                user_id=self.user_id,
                ops=ops,
                shown=shown,
                provenance=Provenance(actor="worker:test", writer="w", model="m"),
                embedder=EMBEDDER,
                limits=LIMITS,
            )

        outcome = await self._in_tx(apply)
        assert outcome.applied == len(ops), outcome.guards
        async with self.sessionmaker() as session:
            for content in adds:
                memory_id = await session.scalar(
                    select(Memory.id).where(Memory.tenant_id == self.tenant_id, Memory.content == content)
                )
                assert memory_id is not None
                targets[memory_id] = (content, "active")
        model.apply(outcome.changeset_id, targets)

    async def edit(self, pick: int, delete: bool) -> None:
        active = self.model.active()
        if not active:
            return
        memory_id = active[pick % len(active)]
        content = self.model.content()

        async def change(session: AsyncSession) -> Memory:
            if delete:
                return await memories.delete_memory(
                    session,
                    self.tenant_id,
                    memory_id,
                    reason=None,
                    actor=WHO.actor,
                    request_id=None,
                    embedder=EMBEDDER,
                )
            return await memories.edit_memory(
                session,
                self.tenant_id,
                memory_id,
                content=content,
                tags=None,
                reason=None,
                actor=WHO.actor,
                request_id=None,
                embedder=EMBEDDER,
            )

        changed = await self._in_tx(change)
        old = self.model.head(memory_id)[0]
        self.model.apply(
            changed.changeset_id, {memory_id: (old, "deleted") if delete else (content, "active")}
        )

    async def _undo(
        self,
        run: Callable[[AsyncSession, bool], Awaitable[history.UndoResult]],
        targets: dict[uuid.UUID, State],
        dry: bool,
    ) -> history.UndoResult:
        """A dry run (when asked) announces exactly the diff the real run then makes, and writes nothing
        (the checks after the step compare the whole bank and history with the unchanged model)."""
        expected = sum(1 for m, s in targets.items() if self.model.head(m) != s)
        if dry:
            announced = await self._in_tx(lambda s: run(s, True))
            assert announced.changeset_id is None
            assert len(announced.diff) == expected
            await self.check()
        result = await self._in_tx(lambda s: run(s, False))
        if dry:
            assert result.diff == announced.diff
        assert len(result.diff) == expected
        assert self.model.apply(result.changeset_id, targets) == expected
        return result

    async def rollback(self, pick: int, version_pick: int, dry: bool) -> None:
        if not self.model.history:
            return
        memory_id = list(self.model.history)[pick % len(self.model.history)]
        past = self.model.history[memory_id]
        to_version = 1 + version_pick % len(past)
        await self._undo(
            lambda s, d: history.rollback_memory(
                s, self.tenant_id, memory_id, to_version=to_version, who=WHO, embedder=EMBEDDER, dry_run=d
            ),
            {memory_id: past[to_version - 1]},
            dry,
        )

    async def revert(self, pick: int, force: bool, dry: bool) -> None:
        model = self.model
        if not model.changesets:
            return
        changeset = model.changesets[pick % len(model.changesets)]

        def run(session: AsyncSession, dry_run: bool) -> Awaitable[history.UndoResult]:
            return history.revert_changeset(
                session,
                self.tenant_id,
                changeset.id,
                who=WHO,
                embedder=EMBEDDER,
                force=force,
                dry_run=dry_run,
            )

        conflicts = {m for m, v in changeset.touches.items() if len(model.history[m]) > v}
        if changeset.status == "reverted" or (conflicts and not force):
            with pytest.raises(ConflictError) as refused:
                await self._in_tx(lambda s: run(s, False))
            if changeset.status == "reverted":
                assert refused.value.code == "already_reverted"
            else:
                assert refused.value.code == "revert_conflict"
                assert {uuid.UUID(c["memory_id"]) for c in refused.value.details["conflicts"]} == conflicts
            return
        targets = {
            m: model.history[m][v - 2] if v > 1 else (model.history[m][0][0], "deleted")
            for m, v in changeset.touches.items()
        }
        result = await self._undo(run, targets, dry)
        assert {uuid.UUID(c["memory_id"]) for c in result.conflicts} == conflicts
        changeset.status = "reverted"
        if not conflicts:
            # Reverting brings back exactly what the changeset replaced (a revert's revert: the
            # reverted state).
            for memory_id, before in changeset.before.items():
                expected = before if before is not None else (model.history[memory_id][0][0], "deleted")
                assert model.head(memory_id) == expected

    async def restore(self, pick: int, dry: bool) -> None:
        model = self.model
        if not model.checkpoints:
            return
        as_of, counts = model.checkpoints[pick % len(model.checkpoints)]
        targets = {
            m: past[counts[m] - 1] if m in counts else (past[-1][0], "deleted")
            for m, past in model.history.items()
        }
        await self._undo(
            lambda s, d: history.restore_user(
                s, self.tenant_id, self.user_id, as_of=as_of, who=WHO, embedder=EMBEDDER, dry_run=d
            ),
            targets,
            dry,
        )
        # Whatever the model says: the bank is now, memory by memory, what an as_of read shows for then.
        async with self.sessionmaker() as session:
            then = await MemoryRepository(session).bank_as_of(
                self.tenant_id, self.user_id, as_of, statuses=None
            )
        heads, _ = await _db_bank(self.sessionmaker, self.tenant_id, self.user_id)
        for m in then:
            assert heads[m.id][:2] == (m.content, m.status)
        assert {m for m, (_, s, _) in heads.items() if s != "deleted"} <= {m.id for m in then}

    async def check(self) -> None:
        heads, past = await _db_bank(self.sessionmaker, self.tenant_id, self.user_id)
        model = self.model
        assert past == model.history
        assert heads == {m: (*model.head(m), len(p)) for m, p in model.history.items()}

    async def checkpoint(self) -> None:
        self.model.checkpoints.append(
            (await db_now(self.sessionmaker), {m: len(p) for m, p in self.model.history.items()})
        )

    async def step(self, step: tuple[Any, ...]) -> None:
        name, *args = step
        if name == "write":
            await self.write(args[0])
        elif name in ("edit", "delete"):
            await self.edit(args[0], delete=name == "delete")
        else:
            await getattr(self, name)(*args)
        await self.check()
        await self.checkpoint()


async def test_undo_matches_a_simple_model(
    sessionmaker: async_sessionmaker[AsyncSession], tenant: TenantKeys
) -> None:
    loop = asyncio.get_running_loop()

    @settings(
        max_examples=120,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(seed=st.lists(WRITE, min_size=1, max_size=3), steps=st.lists(STEPS, min_size=1, max_size=14))
    def run(seed: list[tuple[Any, ...]], steps: list[tuple[Any, ...]]) -> None:
        steps = seed + steps
        machine = Steps(sessionmaker, tenant.tenant_id, f"user-{uuid.uuid4().hex[:8]}")
        _run(loop, machine.checkpoint())
        for step in steps:
            _run(loop, machine.step(step))

    await asyncio.to_thread(run)
