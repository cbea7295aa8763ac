"""The fair scheduler's rules, against a real Redis and no worker: who is served next when tenants and
users compete, and what weights, caps, pauses, bands, backoffs and a dead worker change."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from arq.connections import ArqRedis

from app.domain.pipeline.scheduler import FairScheduler, Shares, Turn, configure, queues, ready_call, run_call
from app.domain.system.services import HEARTBEAT_KEY
from app.lib.queue import create_redis

A, B, C = (uuid.UUID(int=n) for n in (0xA, 0xB, 0xC))


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[ArqRedis]:
    client = create_redis(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def scheduler(redis: ArqRedis) -> FairScheduler:
    await redis.set(HEARTBEAT_KEY.format(name="w1"), "{}")  # the taking worker is alive
    return FairScheduler(redis, worker="w1", lease_s=60)


async def make_ready(
    redis: ArqRedis,
    tenant: uuid.UUID,
    users: list[str],
    *,
    backfill: bool = False,
    due_ms: int = 0,
    revive: bool = False,
) -> None:
    await run_call(redis, ready_call([(tenant, u, backfill, due_ms, revive) for u in users]))


def who(turns: list[Turn]) -> list[tuple[uuid.UUID, str]]:
    return [(t.tenant_id, t.user_id) for t in turns]


async def serve(scheduler: FairScheduler, slots: int, *, more: bool = True) -> list[Turn]:
    """One round of `slots` turns, each serving one chunk and leaving the scope ready again if `more`."""
    turns = await scheduler.take(slots)
    for turn in turns:
        await scheduler.done(turn, served=1, more=more)
    return turns


async def test_a_tenant_arriving_behind_a_backlog_is_served_next(
    redis: ArqRedis, scheduler: FairScheduler
) -> None:
    await make_ready(redis, A, [f"a{n}" for n in range(300)])
    for _ in range(20):  # A has been served a while
        await serve(scheduler, 4)
    await make_ready(redis, B, ["b0"])
    nxt = await scheduler.take(2)
    assert (B, "b0") in who(nxt), who(nxt)


async def test_alone_a_tenant_gets_every_slot(redis: ArqRedis, scheduler: FairScheduler) -> None:
    await make_ready(redis, A, [f"a{n}" for n in range(50)])
    turns = await scheduler.take(32)
    assert len(turns) == 32
    assert {t.tenant_id for t in turns} == {A}


async def test_weights_three_to_one_share_the_turns_three_to_one(
    redis: ArqRedis, scheduler: FairScheduler
) -> None:
    await configure(redis, A, Shares(weight=3.0))
    await configure(redis, B, Shares(weight=1.0))
    await make_ready(redis, A, [f"a{n}" for n in range(40)])
    await make_ready(redis, B, [f"b{n}" for n in range(40)])
    served: Counter[uuid.UUID] = Counter()
    for _ in range(100):
        served.update(t.tenant_id for t in await serve(scheduler, 4))
    ratio = served[A] / served[B]
    print(f"turns A:B = {served[A]}:{served[B]} = {ratio:.2f}")
    assert 2.7 <= ratio <= 3.3, served


async def test_a_turn_that_served_many_chunks_is_charged_for_them(
    redis: ArqRedis, scheduler: FairScheduler
) -> None:
    """Equal weights, but A's turns each serve five chunks: B gets about five turns to A's one."""
    await make_ready(redis, A, [f"a{n}" for n in range(20)])
    await make_ready(redis, B, [f"b{n}" for n in range(20)])
    chunks: Counter[uuid.UUID] = Counter()
    for _ in range(120):
        for turn in await scheduler.take(1):
            served = 5 if turn.tenant_id == A else 1
            chunks[turn.tenant_id] += served
            await scheduler.done(turn, served=served, more=True)
    print(f"chunks A:B = {chunks[A]}:{chunks[B]}")
    assert 0.8 <= chunks[A] / chunks[B] <= 1.25, chunks


async def test_users_of_a_tenant_take_turns_and_live_ones_come_before_a_backfill(
    redis: ArqRedis, scheduler: FairScheduler
) -> None:
    await make_ready(redis, A, [f"import{n}" for n in range(10)], backfill=True)
    await make_ready(redis, A, ["live0", "live1"])
    first = who(await serve(scheduler, 2, more=True))
    assert sorted(u for _, u in first) == ["live0", "live1"]
    # the live users, ready again, still come first; each is served in turn with the other
    second = who(await serve(scheduler, 2, more=False))
    assert sorted(u for _, u in second) == ["live0", "live1"]
    rest = who(await scheduler.take(10))
    assert {u for _, u in rest} == {f"import{n}" for n in range(10)}
    # a wake-up for a backfill scope that also gets live chunks moves it up
    await make_ready(redis, B, ["x"], backfill=True)
    await make_ready(redis, B, ["x"])
    [turn] = await scheduler.take(1)
    assert (turn.user_id, turn.backfill) == ("x", False)


async def test_a_cap_holds_across_takes_and_the_slots_go_to_the_others(
    redis: ArqRedis, scheduler: FairScheduler
) -> None:
    await configure(redis, A, Shares(cap=4))
    await make_ready(redis, A, [f"a{n}" for n in range(20)])
    await make_ready(redis, B, [f"b{n}" for n in range(20)])
    taken = await scheduler.take(10)
    assert Counter(t.tenant_id for t in taken) == {A: 4, B: 6}
    assert Counter(t.tenant_id for t in await scheduler.take(10)) == {B: 10}  # A at its cap
    await scheduler.done(next(t for t in taken if t.tenant_id == A), served=1, more=False)
    assert Counter(t.tenant_id for t in await scheduler.take(10)) == {A: 1, B: 4}


async def test_a_paused_tenant_waits_and_is_served_at_once_when_unpaused(
    redis: ArqRedis, scheduler: FairScheduler
) -> None:
    await make_ready(redis, A, ["a0", "a1"])
    await make_ready(redis, B, ["b0"])
    [turn] = await scheduler.take(1)  # equal passes: the lower id first
    assert turn.tenant_id == A
    # The worker found A's budget spent: the scope is given back untouched, and A paused.
    far = 4_102_444_800_000  # 2100
    await scheduler.done(turn, served=0, more=True, shares=Shares(paused_until_ms=far))
    assert who(await scheduler.take(10)) == [(B, "b0")]
    assert [(q.tenant_id, q.paused) for q in await queues(redis) if q.paused] == [(str(A), True)]
    await configure(redis, A, Shares())  # the budget raised
    assert sorted(who(await scheduler.take(10))) == [(A, "a0"), (A, "a1")]


async def test_a_due_scope_waits_until_then(redis: ArqRedis, scheduler: FairScheduler) -> None:
    await make_ready(redis, A, ["later"], due_ms=int((time.time() + 3600) * 1000))
    await make_ready(redis, A, ["soon"], due_ms=int(time.time() * 1000) - 1)
    assert who(await scheduler.take(5)) == [(A, "soon")]


async def test_a_wake_up_during_a_turn_leaves_the_scope_ready_behind_it(
    redis: ArqRedis, scheduler: FairScheduler
) -> None:
    await make_ready(redis, A, ["ann"])
    [turn] = await scheduler.take(1)
    await make_ready(redis, A, ["ann"])  # a chunk committed while the turn runs
    assert await scheduler.take(1) == []  # not taken twice at once
    await scheduler.done(turn, served=1, more=False)  # the turn's last look missed that chunk
    assert who(await scheduler.take(1)) == [(A, "ann")]


async def test_a_dead_workers_turn_is_revived_by_the_sweeper_a_live_ones_is_not(
    redis: ArqRedis, scheduler: FairScheduler
) -> None:
    dead = FairScheduler(redis, worker="gone", lease_s=600)  # no heartbeat: its worker was killed
    await make_ready(redis, A, ["ann", "bob"])
    taken = await dead.take(1) + await scheduler.take(1)
    assert sorted(who(taken)) == [(A, "ann"), (A, "bob")]
    await make_ready(redis, A, ["ann", "bob"], revive=True)  # the sweeper finds both untouched
    assert who(await scheduler.take(5)) == who(taken[:1])


async def test_a_workers_stale_read_of_the_settings_does_not_undo_a_weight_just_set(
    redis: ArqRedis, scheduler: FairScheduler
) -> None:
    """Workers cache a tenant's settings a while: a turn's end that carries the old weight leaves the one
    the settings API just gave the scheduler."""
    await configure(redis, A, Shares(weight=3.0))
    await make_ready(redis, A, [f"a{n}" for n in range(40)])
    await make_ready(redis, B, [f"b{n}" for n in range(40)])
    served: Counter[uuid.UUID] = Counter()
    for _ in range(100):
        for turn in await scheduler.take(4):
            served[turn.tenant_id] += 1
            await scheduler.done(turn, served=1, more=True, shares=Shares(weight=1.0))  # the stale read
    print(f"turns A:B = {served[A]}:{served[B]}")
    assert 2.7 <= served[A] / served[B] <= 3.3, served
