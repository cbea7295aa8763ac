"""`memstore db distribute` on one Postgres: it says so and changes nothing (the cluster's own test,
opt-in, is tests/citus/)."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from app.cli.db import distribute_database
from app.db.distribution import Distribution, DistributionError, _parents_first, describe


async def test_a_single_postgres_is_described_as_one(owner_database_url: str) -> None:
    engine = create_async_engine(owner_database_url)
    try:
        async with engine.connect() as conn:
            found = await describe(conn)
    finally:
        await engine.dispose()
    assert found == Distribution(citus=None)
    assert found.summary == "single Postgres"


async def test_distribute_refuses_a_postgres_without_citus(owner_database_url: str) -> None:
    with pytest.raises(DistributionError, match="no Citus"):
        await distribute_database(owner_database_url)


def test_tables_are_distributed_after_the_tables_their_keys_point_to() -> None:
    tables = {
        "writer_views": ["changesets", "tenants"],
        "changesets": ["tenants"],
        "webhook_deliveries": ["webhook_endpoints", "webhook_events"],
        "webhook_events": [],
        "webhook_endpoints": [],
    }
    order = _parents_first(tables)
    assert sorted(order) == sorted(tables)
    assert order.index("changesets") < order.index("writer_views")
    assert order.index("webhook_events") < order.index("webhook_deliveries")
    assert order.index("webhook_endpoints") < order.index("webhook_deliveries")
