"""The fleet over six hosts, with links cut while chunks are posted and applied (`make test-hosts`).

The rig (tests/hosts/conftest.py) puts each role in a Linux network namespace of its own, on a bridge of
its own (`mshost-br`, 10.213.0.0/24; the bridge's address, 10.213.0.1, is the client the tests post
from): Postgres (the embedded stack's binaries, run as `pgserver`, listening on 10.213.0.10), Redis
(Debian's redis-server, 10.213.0.11), two API processes (`memstore serve`, 10.213.0.21 and .22) and two
workers (`memstore worker`, .31 and .32), offline writer and hashing embedder. No namespace has a
route past the /24, nothing is forwarded or NATed. The tests read the database as its owner over
Postgres's Unix socket, which no cut reaches.

A cut is a silent drop: an nftables table in the cut host's namespace drops every packet to and from
the peer's address, as a partition does — no RST, no ICMP — so what runs out is TCP's retransmissions
and the service's own timeouts, not a refused connection. (Without nftables, blackhole routes on both
sides drop the packets too, but the host's own sends then fail at once; `make test-hosts` installs
Debian's nftables to avoid that.)

Each test streams chunks from a few users, each user's posts one after another, spread over both API
hosts; cuts a link for CUT_S seconds mid-stream; restores it; posts a little more and stops. Then:
every request had an answer within ANSWER_WITHIN_S (a 2xx, or a 5xx with a body saying why); every
acknowledged chunk (202) is applied exactly once (one writer changeset) and each user's chunks were
applied in `seq` order; and everything posted drains within DRAIN_WITHIN_S of the restore. Each test
prints what it saw: the slowest answer during the cut, what was applied during it, the drain's time.

"During an apply" is shown, not hoped for: the cut is made when the worker's connection holds a
transaction that has written the apply's tables, and undone and made again until that transaction is
still open once the cut holds (pg_locks, read over the socket). A worker cut from Postgres keeps the
turns it had taken (an apply serves several users at once), and their users wait for the link: in these
runs most of them, a handful of chunks applied during an 8 s cut. The last test keeps the worker cut for
good and expects the other worker to take its users over, within SERVED_WITHIN_S of the cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest

from tests.hosts.conftest import Database, Fleet, cut, cut_method, restore, seconds_since
from tests.support.waiting import wait_for

CUT_S = 8.0  # how long each link stays cut
ANSWER_WITHIN_S = 20.0  # a request not answered by then counts as hung
DRAIN_WITHIN_S = 90.0
USERS = 6
# The users of a worker lost for good are all served by then after the cut, inside the 35.5 s lease of
# its turns: MEMSTORE_DB_KEEPALIVE_S (10 s) until its statements fail and Postgres drops its backends
# and locks, a probe's connect timeout (5 s) before it stops the turns still in flight, and a margin for
# two loaded cores (seen: 16-22 s).
SERVED_WITHIN_S = 30.0
CITIES = ["Oslo", "Lyon", "Kyoto", "Quito", "Perth", "Cairo", "Lima", "Turku"]


@dataclass
class Post:
    """One POST /v1/chunks and its answer (`status` None: none within ANSWER_WITHIN_S)."""

    user: str
    host: str
    sent_at: float
    took_s: float
    status: int | None
    body: str
    chunk_id: str | None = None
    seq: int | None = None


@dataclass
class Traffic:
    """USERS users posting chunks, each one after another, alternating between the two API hosts."""

    fleet: Fleet
    users: list[str]
    posts: list[Post] = field(default_factory=list)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    async def _post_as(self, client: httpx.AsyncClient, user: str) -> None:
        for n in itertools.count():
            if self._stopping.is_set():
                return
            host = ("api1", "api2")[n % 2]
            body = {
                "user_id": user,
                "messages": [{"role": "user", "content": f"I live in {CITIES[n % len(CITIES)]}."}],
            }
            sent_at = time.monotonic()
            try:
                async with asyncio.timeout(ANSWER_WITHIN_S):
                    response = await client.post(f"{self.fleet.api_url(host)}/v1/chunks", json=body)
            except (TimeoutError, httpx.TimeoutException) as exc:
                self.posts.append(Post(user, host, sent_at, seconds_since(sent_at), None, repr(exc)))
                continue
            except httpx.TransportError as exc:  # refused or reset: no HTTP answer, which is no clear answer
                self.posts.append(Post(user, host, sent_at, seconds_since(sent_at), 0, repr(exc)))
                continue
            post = Post(user, host, sent_at, seconds_since(sent_at), response.status_code, response.text)
            if response.status_code == 202:
                post.chunk_id, post.seq = response.json()["chunk_id"], response.json()["seq"]
            self.posts.append(post)
            # Time itself must pass here: a steady stream of a few chunks a second per user, not a flood
            # that two shared cores would take minutes to drain.
            await asyncio.sleep(0.25)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Traffic]:
        headers = {"Authorization": f"Bearer {self.fleet.admin_key}"}
        async with httpx.AsyncClient(headers=headers, timeout=ANSWER_WITHIN_S, trust_env=False) as client:
            tasks = [asyncio.create_task(self._post_as(client, user)) for user in self.users]
            try:
                yield self
            finally:
                self._stopping.set()
                await asyncio.gather(*tasks)

    def acknowledged(self) -> list[Post]:
        return [p for p in self.posts if p.status == 202]

    def sent_between(self, start: float, end: float) -> list[Post]:
        return [p for p in self.posts if start <= p.sent_at < end]


APPLY_TABLES = {"memories", "memory_versions", "changesets"}


@dataclass
class Partition:
    """What one cut showed: the traffic, when the link went and came back, what was applied meanwhile,
    what the cut host was writing when it went (a cut during an apply), when everything was applied."""

    traffic: Traffic
    cut_at: float
    restored_at: float
    applied_during: int
    writing: list[str]
    drained_at: float

    def report(self, name: str) -> None:
        during = self.traffic.sent_between(self.cut_at, self.restored_at)
        slowest = {
            host: max((p.took_s for p in during if p.host == host), default=0.0) for host in ("api1", "api2")
        }
        statuses = sorted({p.status for p in during}, key=str)
        writing = f" (it was writing {', '.join(self.writing)})" if self.writing else ""
        print(
            f"\n[{name}] cut by {cut_method()} for {self.restored_at - self.cut_at:.1f} s{writing}:"
            f" {len(during)} chunks posted during it, answered {statuses},"
            f" slowest answer {slowest['api1']:.2f} s from api1, {slowest['api2']:.2f} s from api2;"
            f" {self.applied_during} applied during it; all {len(self.traffic.posts)} posted applied"
            f" {self.drained_at - self.restored_at:.1f} s after the restore"
        )


def new_users(name: str) -> list[str]:
    run = uuid.uuid4().hex[:6]
    return [f"{name}-{run}-{i}" for i in range(USERS)]


async def wait_for_posts(traffic: Traffic, count: int, what: str) -> None:
    await wait_for(lambda: len(traffic.acknowledged()), lambda n: n >= count, timeout_s=30, what=what)


async def cut_inside_an_apply(database: Database, host: str, peer: str) -> tuple[float, list[str]]:
    """Cut `host` from `peer` at a moment `host` is inside an apply's transaction, and still is once
    the cut holds (an apply takes milliseconds: a cut that came after its commit is undone and tried
    again); when the cut that held was made, and the tables the apply had written."""
    for _ in range(20):
        await wait_for(
            lambda: database.written_by(host),
            lambda tables: bool(APPLY_TABLES & set(tables)),
            timeout_s=30,
            what=f"{host} inside an apply",
            interval_s=0.005,
        )
        cut(host, peer)
        cut_at = time.monotonic()
        # Time itself must pass: a transaction that was committing as the cut came has ended by then.
        await asyncio.sleep(0.5)
        written = await database.written_by(host)
        if APPLY_TABLES & set(written):
            return cut_at, written
        restore(host, peer)
    pytest.fail(f"{host} was never caught inside an apply in 20 tries")


async def cut_mid_stream(
    fleet: Fleet, database: Database, name: str, host: str, peer: str, *, during_an_apply: bool = False
) -> Partition:
    """Stream, cut `host` from `peer`, restore after CUT_S, stream a little more, stop, and wait until
    every chunk posted is applied (within DRAIN_WITHIN_S)."""
    traffic = Traffic(fleet, new_users(name))
    writing: list[str] = []
    async with traffic.running():
        await wait_for_posts(traffic, 2 * USERS, "the stream to be flowing")
        await wait_for(lambda: database.applied(traffic.users), timeout_s=30, what="a first chunk applied")
        applied_before = await database.applied(traffic.users)
        if during_an_apply:
            cut_at, writing = await cut_inside_an_apply(database, host, peer)
        else:
            cut(host, peer)
            cut_at = time.monotonic()
        try:
            # Time itself must pass: the partition lasts CUT_S, whatever the fleet does meanwhile.
            await asyncio.sleep(max(0.0, CUT_S - seconds_since(cut_at)))
            applied_during = await database.applied(traffic.users) - applied_before
        finally:
            restore(host, peer)
        restored_at = time.monotonic()
        await wait_for_posts(traffic, len(traffic.acknowledged()) + 2 * USERS, "the stream after the restore")
    await wait_for(
        lambda: database.unapplied(traffic.users),
        lambda left: not left,
        timeout_s=DRAIN_WITHIN_S,
        what="every chunk posted to be applied",
    )
    return Partition(traffic, cut_at, restored_at, applied_during, writing, time.monotonic())


def assert_every_request_answered(traffic: Traffic) -> None:
    hung = [p for p in traffic.posts if p.status is None]
    assert not hung, f"{len(hung)} requests had no answer within {ANSWER_WITHIN_S} s: {hung[:3]}"
    unclear = [p for p in traffic.posts if p.status is not None and not answered_clearly(p)]
    assert not unclear, f"answers neither 2xx nor a 5xx with a body: {unclear[:3]}"


def answered_clearly(post: Post) -> bool:
    assert post.status is not None
    return 200 <= post.status < 300 or (post.status >= 500 and bool(post.body))


async def assert_applied_once_in_order(database: Database, traffic: Traffic) -> None:
    rows = {c.id: c for c in await database.chunks(traffic.users)}
    acknowledged = traffic.acknowledged()
    missing = [p for p in acknowledged if p.chunk_id not in rows]
    assert not missing, f"acknowledged chunks not in the database: {missing[:3]}"
    outcomes = [
        (rows[p.chunk_id].seq, rows[p.chunk_id].status, rows[p.chunk_id].applies) for p in acknowledged
    ]
    not_once = [o for o in outcomes if o[1:] != ("applied", 1)]
    assert not not_once, (
        f"acknowledged chunks not applied exactly once (seq, status, applies): {not_once[:5]}"
    )
    for user in traffic.users:
        seqs = [p.seq for p in acknowledged if p.user == user]
        assert seqs == sorted(seqs), f"{user}'s acknowledgements out of seq order: {seqs}"
        applied = sorted((c for c in rows.values() if c.user_id == user), key=lambda c: c.seq)
        order = [c.seq for c in sorted(applied, key=lambda c: (c.applied_at, c.seq))]
        assert order == [c.seq for c in applied], f"{user}'s chunks applied out of seq order: {order}"


async def test_a_worker_cut_from_postgres_during_an_apply(fleet: Fleet, database: Database) -> None:
    partition = await cut_mid_stream(fleet, database, "w-pg", "worker1", "pg", during_an_apply=True)
    partition.report("worker1 | postgres")
    assert_every_request_answered(partition.traffic)
    await assert_applied_once_in_order(database, partition.traffic)


async def test_a_worker_cut_from_redis(fleet: Fleet, database: Database) -> None:
    partition = await cut_mid_stream(fleet, database, "w-redis", "worker1", "redis")
    partition.report("worker1 | redis")
    assert_every_request_answered(partition.traffic)
    await assert_applied_once_in_order(database, partition.traffic)


async def test_an_api_host_cut_from_redis(fleet: Fleet, database: Database) -> None:
    partition = await cut_mid_stream(fleet, database, "api-redis", "api1", "redis")
    partition.report("api1 | redis")
    assert_every_request_answered(partition.traffic)
    # Ingestion never waits on Redis past its enqueue's timeout: the cut API host acknowledges every chunk.
    during = partition.traffic.sent_between(partition.cut_at, partition.restored_at)
    assert {p.status for p in during} == {202}, [p for p in during if p.status != 202][:3]
    await assert_applied_once_in_order(database, partition.traffic)


async def test_a_worker_lost_for_good_during_an_apply_leaves_its_users_to_the_others(
    fleet: Fleet, database: Database
) -> None:
    """worker1 cut from Postgres inside an apply and never restored: its users are served by worker2
    within SERVED_WITHIN_S of the cut, well inside the 35.5 s lease of the turns worker1 held. Both
    ends drop the cut connections after MEMSTORE_DB_KEEPALIVE_S (10 s): Postgres ends worker1's
    backends, its open apply and the scope locks with them; worker1's statements fail, its turns end
    and are given back, and it takes no more turns until Postgres answers it (it still reaches Redis)."""
    traffic = Traffic(fleet, new_users("w-gone"))
    try:
        async with traffic.running():
            await wait_for_posts(traffic, 2 * USERS, "the stream to be flowing")
            await wait_for(
                lambda: database.applied(traffic.users), timeout_s=30, what="a first chunk applied"
            )
            cut_at, _ = await cut_inside_an_apply(database, "worker1", "pg")
            await wait_for_posts(
                traffic, len(traffic.acknowledged()) + 2 * USERS, "the stream during the cut"
            )
        await wait_for(
            lambda: database.unapplied(traffic.users),
            lambda left: not left,
            timeout_s=max(0.0, SERVED_WITHIN_S - seconds_since(cut_at)),
            what=f"the other worker to apply every chunk within {SERVED_WITHIN_S} s of the cut",
        )
        served_after = seconds_since(cut_at)
    finally:
        restore("worker1", "pg")
    print(
        f"\n[worker1 | postgres, for good] {len(traffic.posts)} posted, all applied"
        f" {served_after:.1f} s after the cut"
    )
    assert_every_request_answered(traffic)
    await assert_applied_once_in_order(database, traffic)
