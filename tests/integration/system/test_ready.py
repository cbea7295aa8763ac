"""`/health` answers while the process lives; `/ready` only while Postgres, Redis and the schema do."""

from __future__ import annotations

from pathlib import Path

from litestar.testing import AsyncTestClient

from app.config import Settings
from app.lib.embedded import EmbeddedRedis
from app.server.asgi import create_app


async def test_ready_when_everything_is_up(settings: Settings) -> None:
    async with AsyncTestClient(create_app(settings, configure_logs=False)) as client:
        assert (await client.get("/health")).json() == {"status": "ok"}
        response = await client.get("/ready")
        assert response.status_code == 200
        assert response.json()["checks"] == {"postgres": "ok", "migrations": "ok", "redis": "ok"}


async def test_ready_fails_while_redis_is_down_and_recovers(settings: Settings, tmp_path: Path) -> None:
    redis = EmbeddedRedis(tmp_path / "redis")
    redis.start()
    own = settings.model_copy(update={"redis_url": redis.url})
    try:
        async with AsyncTestClient(create_app(own, configure_logs=False)) as client:
            assert (await client.get("/ready")).status_code == 200
            redis.stop()
            response = await client.get("/ready")
            assert response.status_code == 503
            assert response.headers["retry-after"]
            body = response.json()
            assert body["error"]["code"] == "unavailable"
            assert body["error"]["details"]["redis"] == "unreachable"
            assert body["error"]["details"]["postgres"] == "ok"
            assert (await client.get("/health")).status_code == 200
            redis.start()
            assert (await client.get("/ready")).status_code == 200
    finally:
        redis.stop()


async def test_ready_fails_when_postgres_is_unreachable(settings: Settings, tmp_path: Path) -> None:
    nowhere = f"postgresql+asyncpg://postgres@/memstore?host={tmp_path}"
    own = settings.model_copy(update={"database_url": nowhere, "db_connect_timeout_s": 1.0})
    async with AsyncTestClient(create_app(own, configure_logs=False)) as client:
        response = await client.get("/ready")
        assert response.status_code == 503
        assert response.json()["error"]["details"]["postgres"].startswith("unreachable")
        # An authenticated route answers 503 `unavailable`, not a bare 500.
        response = await client.get("/v1/admin/keys", headers={"Authorization": "Bearer ms_x"})
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "unavailable"
        assert response.headers["retry-after"]


async def test_ready_fails_when_schema_is_behind(settings: Settings, servers: object, engine: object) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncEngine

    assert isinstance(engine, AsyncEngine)
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = 'older'"))
    async with AsyncTestClient(create_app(settings, configure_logs=False)) as client:
        response = await client.get("/ready")
    assert response.status_code == 503
    assert "expected" in response.json()["error"]["details"]["migrations"]
