"""The service on a Citus cluster (`make test-citus`): a coordinator and two workers started by the code
of `memstore up --citus-workers 2` (`app.lib.embedded.EmbeddedCitus`), migrated and distributed by
tenant, with an embedded Redis; the real API and real workers with the offline writer.

Opt-in, not part of `make test`: run only with MEMSTORE_TEST_CITUS=1 (which `make test-citus` sets),
and skipped, saying why, without the Citus build (`make citus`). The cluster is shared by the module's
tests, which keep apart by tenant."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from app.config import Settings
from app.lib.embedded import CITUS_HOME, EmbeddedCitusNode, EmbeddedStack, citus_bin_dir

OPT_IN = "MEMSTORE_TEST_CITUS"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = None
    if os.environ.get(OPT_IN) != "1":
        reason = f"the Citus cluster tests run with `make test-citus` ({OPT_IN}=1)"
    elif citus_bin_dir() is None:
        reason = f"no Citus build in {CITUS_HOME}: `make citus CITUS_SRC=<Citus source tree>`"
    if reason is None:
        return
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@dataclass
class Cluster:
    owner_url: str
    service_url: str
    redis_url: str
    coordinator: EmbeddedCitusNode
    workers: list[EmbeddedCitusNode]

    async def connect(self, node: EmbeddedCitusNode, user: str = "postgres") -> asyncpg.Connection:
        """A connection to a node's service database, as `user`."""
        return await asyncpg.connect(host=str(node.socket_dir), user=user, database=node.database)


def service_settings(database_url: str, owner_url: str, redis_url: str, **overrides: Any) -> Settings:
    """The service's settings on a cluster (or a Postgres) for these tests: the offline writer, the
    hashing embedder, no rate limits."""
    fields: dict[str, Any] = {
        "database_url": database_url,
        "admin_database_url": owner_url,
        "redis_url": redis_url,
        "auth_cache_ttl_s": 0.0,
        "log_format": "console",
        "rate_limit_per_s": 0.0,
        "user_rate_limit_per_s": 0.0,
        "embedder": "hashing",
        "writer": "offline",
    }
    return Settings(**(fields | overrides))


@contextlib.contextmanager
def started_cluster(prefix: str) -> Iterator[Cluster]:
    """A coordinator and two workers, migrated and distributed as `memstore up --citus-workers 2` does;
    stopped and removed afterwards."""
    from app.cli.db import distribute_database
    from app.db.migrate import upgrade

    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    stack = EmbeddedStack(data_dir, citus_workers=2)
    owner_url, redis_url = stack.start()
    try:
        upgrade(owner_url)
        asyncio.run(distribute_database(owner_url))
        assert stack.cluster is not None
        yield Cluster(owner_url, stack.service_url, redis_url, stack.cluster.coordinator, stack.cluster.nodes)
    finally:
        stack.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with started_cluster("memstore-citus-") as started:
        yield started
