"""Round trips per applied chunk in the worker, held to a budget written here, so a change that adds
one to the apply path fails and has to say why.

One chunk of a user is drained and applied by a worker's turn (`run_turn`) on the scope the fair
scheduler gives it (`FairScheduler.take`, counted with the turn), with the
clients the worker's real start-up opens (`workers.settings.startup`: its engine, its Redis client,
its embedder, its writers), by the offline writer and by the `simple` profile against the fake model
server, which also serves the embeddings. What is counted (`tests/support/round_trips.py`):

- Postgres, at the wire: every round trip asyncpg makes on the worker engine's connections (the
  scope-lock connection included); and the statements SQLAlchemy executes. The worker's engine has
  no pre-ping, and its connections carry the tenant already, so neither adds a round trip here.
- Redis: the round trips of the worker's job client pool. arq's own bookkeeping around a job (its
  dequeue, in-progress key, result) is not part of the job body and is not counted; no arq worker
  runs, so no poll, heartbeat or cron job (the sweeper, the audit seal) can leak in. Nor is the
  pool's connection upkeep (a new connection's handshake, CLIENT SETINFO ...; the PING on one idle
  10 s, `health_check_interval`): the ledger keeps it apart (`upkeep`), as it follows from how long
  the connection sat idle or whether it was dropped, not from the job.
- The embedder: model runs, texts embedded and cache hits of the worker's embedder
  (`app.embeddings.embedder_counts`), and the requests and texts the embeddings server answered.
- The writer: calls to the model (the fake server's count).

The chunk measured is a user's second (the first left a memory, so the candidate search finds one),
with a sentence no earlier chunk had (the embedder's cache cannot answer it). A warm-up user first
runs the same two chunks, so every statement is prepared and the tenant's options are cached (read
once per 30 s). The budgets are exact, for the same reason as the ingest ones
(`test_ingest_budget.py`): a round trip removed fails too, and the budget is lowered with it. If
connection upkeep fell in the measured job, a third user runs the same two chunks (new sentences of
the same shape) and its second is measured instead; upkeep in that one too fails the test (a
connection opened or checked per job is a regression).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.config import Settings
from app.domain.pipeline.jobs import WorkerContext, run_turn
from app.domain.pipeline.scheduler import PREFIX
from app.embeddings import EmbedderCounts, embedder_counts
from app.lib.queue import create_redis
from tests.conftest import TenantKeys, writers_toml
from tests.support.fake_llm import FakeLLM
from tests.support.round_trips import PostgresLedger, RedisLedger, budget_diff
from tests.support.waiting import wait_for
from workers.settings import shutdown, startup

Client = AsyncTestClient[Litestar]

# Users who each post two chunks, the second measured (the warm-up's not counted): a user, where they
# live, what they drink. The last is measured only if connection upkeep fell in the one before.
USERS = [
    ("warm-up", "Oslo", "green tea"),
    ("measured", "Lima", "mate"),
    ("measured-again", "Quito", "coffee"),
]

# Postgres round trips of one applied chunk, by the offline writer.
PG_OFFLINE = {
    "execute SELECT pg_try_advisory_lock": 1,  # the scope's lock, on the locks' own connection
    # The claim (a single statement outside any transaction), twice: the chunk, then nothing left.
    "execute WITH FROM pg_stat_get_activity, chunks, next_chunk, scope_lock, claimed": 2,
    # The nearest memories: the writer's candidate search (before the apply), and the apply's look
    # for near duplicates (in its transaction).
    "execute SELECT FROM unnest, memories": 2,
    # The apply's transaction (`Applier`): the chunk marked applied, its changeset, the memory, its
    # version, what the writer was shown, the audit event, the webhooks' outbox.
    "query BEGIN": 1,
    "execute UPDATE chunks": 1,
    "execute INSERT INTO changesets": 1,
    "execute INSERT INTO memories": 1,
    "execute INSERT INTO memory_versions": 1,
    "execute INSERT INTO writer_views": 1,
    "execute INSERT INTO audit_events": 1,
    # The webhooks' outbox (`webhooks.events.announce`): one statement per group commit, whatever its
    # size; for a tenant without an enabled endpoint it writes nothing.
    "execute WITH FROM webhook_endpoints, unnest, hook, item, memory_versions, reviews, src, event": 1,
    "query COMMIT": 1,
    "execute SELECT pg_advisory_unlock": 1,  # the lock given back
    "execute SELECT FROM chunks": 1,  # a last look for a chunk that arrived while the lock was held
}
# The `simple` profile shows the model no candidates: no candidate search.
PG_SIMPLE = {**PG_OFFLINE, "execute SELECT FROM unnest, memories": 1}
REDIS_WORKER = {
    # The fair scheduler (`pipeline.scheduler`), one script call each: the scope taken for a free slot,
    # and given back after the turn (charged for its chunk; not ready again: nothing is left).
    "EVALSHA": 2,
    # The chunk announced finished to the API processes' waiting reads (`pipeline.finished`): one
    # PUBLISH for the chunks finished in the same turn of the event loop (here: one).
    "PUBLISH": 1,
}
# The embedder: the new memory's text, embedded once (one model run, one text) before the apply. The
# offline writer's candidate search embeds that same text first, so the apply's embedding of it is
# answered from the embedder's cache.
EMBEDDER_OFFLINE = EmbedderCounts(runs=1, texts=1, cache_hits=1)
EMBEDDER_SIMPLE = EmbedderCounts(runs=1, texts=1, cache_hits=0)
MODEL_CALLS = {"offline": 0, "simple": 1}  # the writer's requests to the chat model


@dataclass(frozen=True)
class Budget:
    postgres: dict[str, int]
    redis: dict[str, int]
    embedder: EmbedderCounts


BUDGETS = {
    "offline": Budget(PG_OFFLINE, REDIS_WORKER, EMBEDDER_OFFLINE),
    "simple": Budget(PG_SIMPLE, REDIS_WORKER, EMBEDDER_SIMPLE),
}


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as fake:
        yield fake


@pytest.fixture
def api_settings(settings: Settings, fake_llm: FakeLLM, tmp_path: Path) -> Settings:
    """The writer `simple` and the embeddings on the fake model server; no graph indexer (a task of
    its own on the worker's engine, not in step with the job)."""
    writers = tmp_path / "writers.toml"
    model: dict[str, object] = {"profile": "simple", "base_url": fake_llm.base_url, "model": "hy-memory"}
    writers.write_text(writers_toml({"simple": model}))
    return settings.model_copy(
        update={
            "writers_file": writers,
            "embedder": "openai",
            "embedder_base_url": fake_llm.base_url,
            "graph_index_budget_s": 0.0,
        }
    )


def server_usage(fake: FakeLLM) -> Counter[str]:
    """What the fake model server answered: chat calls, embedding requests and texts."""
    wanted = {"calls", "embedding_calls", "embedding_texts"}
    return Counter({k: v for usage in fake.usage.values() for k, v in usage.items() if k in wanted})


async def ready(settings: Settings, tenant_id: str, user: str) -> None:
    """Until the API has made the scope ready (it answers 202 first), seen by a client of its own."""
    client = create_redis(str(settings.redis_url))
    try:
        key = f"{PREFIX}ready:{tenant_id}"
        await wait_for(lambda: client.zscore(key, user), lambda s: s is not None, timeout_s=10, what=key)
    finally:
        await client.aclose()


async def take_and_turn(ctx: WorkerContext, tenant_id: str, user: str) -> dict[str, Any]:
    """The scope the scheduler gives a free slot (this one: the only one ready), and a turn on it."""
    [turn] = await ctx["scheduler"].take(1)
    assert (str(turn.tenant_id), turn.user_id) == (tenant_id, user)
    return await run_turn(ctx, turn)


async def post(api: Client, headers: dict[str, str], user: str, text: str, writer: str) -> None:
    body: dict[str, Any] = {
        "user_id": user,
        "messages": [{"role": "user", "content": text}],
        "writer": writer,
    }
    response = await api.post("/v1/chunks", json=body, headers=headers)
    assert response.status_code == 202, response.text


@pytest.mark.parametrize("writer", ["offline", "simple"])
async def test_an_applied_chunk_costs_its_budget(
    api: Client,
    ingest_headers: dict[str, str],
    tenant: TenantKeys,
    api_settings: Settings,
    fake_llm: FakeLLM,
    writer: str,
) -> None:
    budget = BUDGETS[writer]
    ctx: WorkerContext = {"settings": api_settings, "redis": create_redis(str(api_settings.redis_url))}
    await startup(ctx)
    postgres = PostgresLedger(ctx["engine"])
    redis = RedisLedger(ctx["redis"].connection_pool)
    tenant_id = str(tenant.tenant_id)
    upkeep: list[list[str]] = []  # the Redis pool's connection upkeep in each measured job
    try:
        for user, place, drink in USERS:
            await post(api, ingest_headers, user, f"I live in {place}.", writer)
            await ready(api_settings, tenant_id, user)
            assert (await take_and_turn(ctx, tenant_id, user))["applied"] == 1
            await post(api, ingest_headers, user, f"I like {drink}.", writer)
            await ready(api_settings, tenant_id, user)
            postgres.reset()
            redis.reset()
            embedder, server = embedder_counts(ctx["pipeline"].embedder), server_usage(fake_llm)
            assert (await take_and_turn(ctx, tenant_id, user))["applied"] == 1
            if user != "warm-up":
                upkeep.append(list(redis.upkeep))
                if not redis.upkeep:
                    break
        assert upkeep[-1] == [], (
            f"Redis connection upkeep in two jobs in a row: {upkeep}. The worker's pool opens or"
            " health-checks a connection for every job: a regression, not the job's budget."
        )
        embedded = embedder_counts(ctx["pipeline"].embedder) - embedder
        served = server_usage(fake_llm) - server
        assert Counter(postgres.wire) == Counter(budget.postgres), budget_diff(
            "Postgres round trips", postgres.wire, budget.postgres
        )
        assert Counter(redis.round_trips) == Counter(budget.redis), budget_diff(
            "Redis round trips", redis.round_trips, budget.redis
        )
        assert embedded == budget.embedder, embedded
        # The embeddings server sees the embedder's model runs and texts; the writer's calls besides.
        assert served == Counter(
            {
                "calls": MODEL_CALLS[writer],
                "embedding_calls": embedded.runs,
                "embedding_texts": embedded.texts,
            }
        ), served
    finally:
        postgres.close()
        redis.close()
        await shutdown(ctx)
        await ctx["redis"].aclose()
