"""Readiness: can this process reach what it needs, and is the schema at the code's migration head?
And the workers' heartbeats in Redis, which `memstore status` and `/metrics` count."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass

from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.migrate import head_revision
from app.lib.queue import JobQueue


@dataclass(frozen=True)
class Readiness:
    postgres: str
    migrations: str
    redis: str

    @property
    def ok(self) -> bool:
        return self.postgres == "ok" and self.migrations == "ok" and self.redis == "ok"


async def _schema_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        revision = await conn.scalar(text("SELECT version_num FROM alembic_version"))
    return None if revision is None else str(revision)


async def check_readiness(engine: AsyncEngine, queue: JobQueue, timeout_s: float = 2.0) -> Readiness:
    """Check Postgres, the migration head and Redis, each bounded by `timeout_s`."""
    postgres, migrations = "ok", "ok"
    try:
        async with asyncio.timeout(timeout_s):
            revision = await _schema_revision(engine)
        if revision != head_revision():
            migrations = f"at {revision}, expected {head_revision()}"
    except (SQLAlchemyError, OSError, TimeoutError) as exc:
        postgres, migrations = f"unreachable ({type(exc).__name__})", "unknown"
    redis = "ok" if await queue.ping() else "unreachable"
    return Readiness(postgres=postgres, migrations=migrations, redis=redis)


# Workers alive: each worker writes its heartbeat (who it is, what it runs) under a key that expires,
# and its name, scored by the time of the beat, into one sorted set, so counting the fresh ones is one
# ZCOUNT at a scrape, not a scan of Redis's keys. A worker that stops cleanly takes both out; one that
# dies drops out of the count after `HEARTBEAT_TTL_S`. The beat is a periodic job of the worker
# (`workers.settings`), never a step of a chunk's path.
HEARTBEAT_KEY = "memstore:workers:{name}"
HEARTBEAT_SET = "memstore:workers"
HEARTBEAT_TTL_S = 30


@dataclass(frozen=True)
class WorkerBeat:
    """One worker's last heartbeat: where it runs, its job slots and the jobs running, by job name."""

    name: str
    host: str
    pid: int
    max_jobs: int
    jobs_running: dict[str, int]
    started_at: float
    beat_at: float

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.beat_at)


async def beat(redis: Redis, worker: WorkerBeat) -> None:
    """Record a worker's heartbeat (one round trip)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.set(HEARTBEAT_KEY.format(name=worker.name), json.dumps(asdict(worker)), ex=HEARTBEAT_TTL_S)
        pipe.zadd(HEARTBEAT_SET, {worker.name: worker.beat_at})
        pipe.zremrangebyscore(HEARTBEAT_SET, "-inf", worker.beat_at - HEARTBEAT_TTL_S)
        await pipe.execute()


async def forget(redis: Redis, name: str) -> None:
    """Take a stopping worker out of the count at once (one round trip)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.delete(HEARTBEAT_KEY.format(name=name))
        pipe.zrem(HEARTBEAT_SET, name)
        await pipe.execute()


async def workers_alive(redis: Redis) -> int:
    """How many workers beat within the last `HEARTBEAT_TTL_S` seconds."""
    return int(await redis.zcount(HEARTBEAT_SET, time.time() - HEARTBEAT_TTL_S, "+inf"))


async def worker_beats(redis: Redis) -> list[WorkerBeat]:
    """The fresh heartbeats, by worker name."""
    names = [
        n.decode() if isinstance(n, bytes) else str(n)
        for n in await redis.zrangebyscore(HEARTBEAT_SET, time.time() - HEARTBEAT_TTL_S, "+inf")
    ]
    if not names:
        return []
    beats = []
    for raw in await redis.mget([HEARTBEAT_KEY.format(name=n) for n in sorted(names)]):
        if raw is None:  # expired between the two reads
            continue
        try:
            beats.append(WorkerBeat(**json.loads(raw)))
        except (TypeError, ValueError):  # a beat of another version: counted, not described
            continue
    return beats
