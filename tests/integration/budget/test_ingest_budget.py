"""Round trips per acknowledged chunk on `POST /v1/chunks` and `POST /v1/chunks/batch`, held to a
budget written here, so a change that adds one to the ingest path fails and has to say why.

What is counted, against the real app on a real Postgres and Redis (`tests/support/round_trips.py`):

- Postgres, at the wire: every round trip asyncpg makes on the API engine's connections — each
  statement's execution (and its prepare, when the connection meets the text for the first time:
  none here, after the warm-up), BEGIN / COMMIT and the tenancy `set_config` on checkout (sent only
  when the connection last served other tenants). The pool's ping (`;`, only for a connection idle a
  second or more) is upkeep, as the Redis pool's below: a loaded machine that paused a second between
  two requests makes it, not the request. Also the statements SQLAlchemy executes, the same
  minus what the pool and the dialect send on their own.
- Redis: the round trips of the API's client pool (the rate limiter and the job queue share it): one
  per packed send, a pipeline being one. Redis's own `INFO commandstats` would also count the Lua
  scripts' inner calls and other clients (a worker's polls): neither is in this count, and no worker
  runs here. Not counted either: the pool's connection upkeep — the handshake of a connection it
  opens (CLIENT SETINFO, ...) and the PING before a command on a connection idle 10 s
  (`health_check_interval`) — which depends on how long the test sat idle or whether a loaded
  machine dropped the connection, not on the request. The ledger keeps it apart (`upkeep`); a
  request measured with upkeep in it is measured again, the same request for a new user, and upkeep
  on that one too fails the test (a connection opened or checked per request is a regression).
- The embedder: model runs, texts and cache hits of the API's embedder
  (`app.embeddings.embedder_counts`), and the requests the embeddings server (the fake model
  server, over real HTTP) answered: all zero.

The budgets are exact (`==`), not ceilings: a round trip removed also fails, and the change lowers
the budget with it, so the numbers here stay the ones the code has. Each request is sent alone and
awaited (the group commit then holds exactly that request in its transaction, and the pool's one
connection has every statement prepared after the warm-up), and the key is resolved from the API's
cache (its lookup costs a few statements once per `auth_cache_ttl_s`). The tenant's backlog count is
off: the batcher takes it in the background, at most once a second, not in step with requests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.config import Settings
from app.embeddings import EmbedderCounts, embedder_counts
from app.server.lifespan import AppServices
from tests.support.fake_llm import FakeLLM
from tests.support.round_trips import PostgresLedger, RedisLedger, budget_diff
from tests.support.waiting import wait_for

Client = AsyncTestClient[Litestar]

BATCH = 10  # chunks in the batch request measured

# Postgres round trips of one `POST /v1/chunks` (one chunk, alone in its group-commit transaction).
PG_SINGLE = {
    # No pre-ping: a connection in use within the last second is not pinged (`app.db.engine`).
    "query BEGIN": 1,
    # No idempotency key sent: no look-up of earlier keys (one SELECT FROM chunks when keys are sent).
    "execute SELECT FROM chunks, scopes": 1,  # the scopes' backlog bound, against their cap
    "execute INSERT INTO scopes": 1,  # the scopes' seq numbers
    "execute INSERT INTO chunks": 1,  # the chunks, a column each as an array (one text, any size)
    "execute INSERT INTO audit_events": 1,  # their chunk.accepted events, the same way
    "query COMMIT": 1,
}
# A batch of chunks of one user: the same round trips, and the same statement texts, whatever its size.
PG_BATCH = PG_SINGLE
# The same, as SQLAlchemy executes them (no BEGIN / COMMIT).
SQL_SINGLE = [
    "SELECT FROM chunks, scopes",
    "INSERT INTO scopes",
    "INSERT INTO chunks",
    "INSERT INTO audit_events",
]
SQL_BATCH = SQL_SINGLE
# Redis round trips of either request (the API's one client pool).
REDIS_INGEST = {
    # The key's rate-limit bucket (`app.lib.ratelimit`): a lease of one token at the 50/s set here, so
    # every request asks; at the default 5,000/s a lease of 100 serves 100 requests.
    "EVALSHA": 2,
    # ... and the users' chunk-rate buckets, charged for the whole group commit in one script call
    # (the second EVALSHA above).
    # After the commit, one pipeline: the scope made ready in the fair scheduler (a script, by its
    # hash: `pipeline.scheduler`) and the message that wakes an idle worker.
    "pipeline[EVALSHA, PUBLISH]": 1,
}
# Ingestion embeds nothing: no model run, no text (the API's embedder, and the embeddings server).
EMBEDDER_INGEST = EmbedderCounts(runs=0, texts=0, cache_hits=0)


# The pool's ping of a connection idle `PING_AFTER_IDLE_S` or more as it leaves the pool (`app.db.engine`):
# it depends on how long the test sat between two requests (a loaded machine can pause for a second),
# not on the request, so it is upkeep, kept apart as the Redis pool's is.
PG_IDLE_PING = "query ;"


@dataclass
class Measured:
    wire: list[str]
    statements: list[str]
    redis: list[str]
    redis_upkeep: list[str]  # the pool's connection upkeep, not in the budget
    embedder: EmbedderCounts
    embedding_requests: Counter[str]
    postgres_upkeep: list[str]  # the pool's ping of an idle connection, not in the budget

    @property
    def upkeep(self) -> list[str]:
        return self.redis_upkeep + self.postgres_upkeep


class IngestProbe:
    def __init__(self, api: Client, headers: dict[str, str], redis_url: str, fake: FakeLLM) -> None:
        self.fake = fake
        self.api = api
        self.headers = headers
        self.services: AppServices = api.app.state.services
        self.postgres = PostgresLedger(self.services.engine)
        self.redis = RedisLedger(self.services.job_queue.redis.connection_pool)
        self.users = 0

    def close(self) -> None:
        self.postgres.close()
        self.redis.close()

    async def post(self, path: str, body: Callable[[], dict[str, Any]]) -> Measured:
        """A request's costs, `body()` its body. If a pool's connection upkeep (Redis: a handshake, a
        health-check PING; Postgres: the ping of a connection idle a second) fell in it, a second
        request made by `body()` (the same shape, for a new user) is measured at once instead, and
        upkeep in that one too fails."""
        measured = await self.measure(path, body())
        if not measured.upkeep:
            return measured
        again = await self.measure(path, body())
        assert not again.upkeep, (
            f"Connection upkeep in two requests in a row: {measured.upkeep}, then {again.upkeep}"
            f" (Redis round trips {again.redis}, Postgres {again.wire}). A pool opens, pings or"
            " health-checks a connection for every request: a regression, not the request's budget."
        )
        return again

    async def measure(self, path: str, body: dict[str, Any]) -> Measured:
        self.postgres.reset()
        self.redis.reset()
        before = embedder_usage(self.fake)
        counts = embedder_counts(self.services.embedder)
        response = await self.api.post(path, json=body, headers=self.headers)
        assert response.status_code == 202, response.text
        # The batch's jobs go to Redis after the answer, in a pipeline that ends with the wake-up
        # message: wait until the API has sent it, then until its reply is read and the connection
        # back in the pool, so the next request does not find it in use and open another.
        await wait_for(
            lambda: (list(self.redis.round_trips), self.redis.idle()),
            lambda seen: any("PUBLISH" in sent for sent in seen[0]) and seen[1],
            timeout_s=30,
            what="the wake-up PUBLISH sent and the Redis pool idle again (round trips, idle)",
            interval_s=0.01,
        )
        wire = list(self.postgres.wire)
        return Measured(
            [w for w in wire if w != PG_IDLE_PING],
            list(self.postgres.statements),
            list(self.redis.round_trips),
            list(self.redis.upkeep),
            embedder_counts(self.services.embedder) - counts,
            embedder_usage(self.fake) - before,
            [w for w in wire if w == PG_IDLE_PING],
        )

    def user(self) -> str:
        self.users += 1
        return f"user-{self.users}"


def chunk(user_id: str, n: int = 0) -> dict[str, Any]:
    return {"user_id": user_id, "messages": [{"role": "user", "content": f"I live in Oslo ({n})."}]}


def batch(user_id: str, size: int) -> dict[str, Any]:
    return {"chunks": [chunk(user_id, n) for n in range(size)]}


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


def embedder_usage(fake: FakeLLM) -> Counter[str]:
    """Embedding requests and texts the fake model server has answered, all callers together."""
    return Counter(
        {k: v for usage in fake.usage.values() for k, v in usage.items() if k.startswith("embedding")}
    )


@pytest.fixture
def api_settings(settings: Settings, fake_llm: FakeLLM) -> Settings:
    """The deployment's defaults where the test settings turn a cost off (the rate limit, the key
    cache), and the embeddings on the fake model server, which counts what it is asked."""
    return settings.model_copy(
        update={
            # A key limit small enough that each request asks Redis for its token (a lease of one,
            # `app.lib.ratelimit.lease_size`): the worst case, exactly. At the default 5,000/s a
            # process leases 100 tokens per round trip, so 100 requests share it. The per-user limit
            # at its default (the tests' settings turn it off).
            "rate_limit_per_s": 50.0,
            "rate_limit_burst": 400,
            "user_rate_limit_per_s": Settings.model_fields["user_rate_limit_per_s"].default,
            "auth_cache_ttl_s": 3600.0,
            # The tenant's backlog is counted off the request's path (a background refresh, at most
            # once a second per process, on a connection of its own): not a cost of the request, and
            # not in step with it, so it is left out here.
            "max_queued_per_tenant": 0,
            "embedder": "openai",
            "embedder_base_url": fake_llm.base_url,
        }
    )


@pytest.fixture
async def probe(
    api: Client, ingest_headers: dict[str, str], redis_url: str, fake_llm: FakeLLM
) -> AsyncIterator[IngestProbe]:
    probe = IngestProbe(api, ingest_headers, redis_url, fake_llm)
    try:
        # Warm-up: the key into the cache, the rate limiter's script into Redis, every statement
        # prepared on the (one) pooled connection, the Redis pool's connection opened.
        for _ in range(2):
            await probe.measure("/v1/chunks", chunk(probe.user()))
            await probe.measure("/v1/chunks/batch", batch(probe.user(), BATCH))
        yield probe
    finally:
        probe.close()


def check(m: Measured, pg: dict[str, int], sql: list[str], redis: dict[str, int]) -> None:
    assert Counter(m.wire) == Counter(pg), budget_diff("Postgres round trips", m.wire, pg)
    assert m.statements == sql, budget_diff("SQL statements", m.statements, Counter(sql))
    assert Counter(m.redis) == Counter(redis), budget_diff("Redis round trips", m.redis, redis)
    assert m.upkeep == [], m.upkeep  # `IngestProbe.post` measured a request without it
    assert m.embedder == EMBEDDER_INGEST, m.embedder
    assert m.embedding_requests == Counter(), m.embedding_requests


async def test_a_chunk_posted_alone_costs_its_budget(probe: IngestProbe) -> None:
    for _ in range(2):  # the same again: nothing left over from the one before
        measured = await probe.post("/v1/chunks", lambda: chunk(probe.user()))
        check(measured, PG_SINGLE, SQL_SINGLE, REDIS_INGEST)


@pytest.mark.parametrize("size", [BATCH, 5 * BATCH])
async def test_a_batch_costs_the_same_round_trips_whatever_its_size(probe: IngestProbe, size: int) -> None:
    # Every statement has one text whatever the number of rows: a size this connection has not seen
    # costs no prepare (the SQLAlchemy multi-row VALUES of before cost one per new size).
    measured = await probe.post("/v1/chunks/batch", lambda: batch(probe.user(), size))
    check(measured, PG_BATCH, SQL_BATCH, REDIS_INGEST)
