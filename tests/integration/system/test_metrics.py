"""`/metrics`: Prometheus text with request counts, the backlog from Postgres, and worker outcomes."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import TenantKeys, bearer
from tests.support.workers import running_worker, wait_for_chunks


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return 0.0


async def test_metrics_follow_the_backlog_and_the_workers(
    client: AsyncTestClient[Litestar],
    tenant: TenantKeys,
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    key = (
        await client.post("/v1/admin/keys", json={"name": "m", "roles": ["ingest"]}, headers=tenant.admin)
    ).json()
    before = (await client.get("/metrics")).text
    for text in ("I live in Lyon.", "I like tea.", "I mainly use Go."):
        body = {"user_id": "m-1", "messages": [{"role": "user", "content": text}]}
        assert (await client.post("/v1/chunks", json=body, headers=bearer(key["key"]))).status_code == 202

    response = await client.get("/metrics")  # no key needed: scrapers are not tenants
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    now = response.text
    assert sample(now, "memstore_database_up") == 1
    assert sample(now, "memstore_queue_depth", status="queued") == 3
    assert sample(now, "memstore_queue_depth", status="processing") == 0
    assert sample(now, "memstore_chunk_lag_seconds") > 0
    assert sample(now, "memstore_scheduler_scopes_ready") == 1  # one scope's three chunks: ready once
    assert sample(now, "memstore_scheduler_tenants_paused") == 0
    assert sample(now, "memstore_tenant_queued_chunks", tenant="acme") == 3
    assert sample(now, "memstore_tenant_oldest_queued_seconds", tenant="acme") > 0
    posted = {"method": "POST", "route": "/v1/chunks", "status": "202"}
    assert (
        sample(now, "memstore_http_requests_total", **posted)
        - sample(before, "memstore_http_requests_total", **posted)
        == 3
    )
    assert (
        sample(now, "memstore_chunks_accepted_total") - sample(before, "memstore_chunks_accepted_total") == 3
    )

    async with running_worker(settings):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 3)
    after = (await client.get("/metrics")).text
    assert sample(after, "memstore_queue_depth", status="queued") == 0
    assert sample(after, "memstore_chunk_lag_seconds") == 0
    applied = {"outcome": "applied", "writer": "offline"}
    assert (
        sample(after, "memstore_chunks_finished_total", **applied)
        - sample(before, "memstore_chunks_finished_total", **applied)
        == 3
    )
    assert sample(after, "memstore_writer_duration_seconds_count", writer="offline", outcome="ok") >= 3
    assert sample(after, "memstore_apply_duration_seconds_count") >= 3


async def test_a_worker_serves_its_own_metrics(
    client: AsyncTestClient[Litestar],
    tenant: TenantKeys,
    settings: Settings,
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    key = (
        await client.post("/v1/admin/keys", json={"name": "w", "roles": ["ingest"]}, headers=tenant.admin)
    ).json()
    body = {"user_id": "w-1", "messages": [{"role": "user", "content": "I live in Graz."}]}
    assert (await client.post("/v1/chunks", json=body, headers=bearer(key["key"]))).status_code == 202
    async with running_worker(settings.model_copy(update={"worker_metrics_port": port})):
        await wait_for_chunks(sessionmaker, tenant.tenant_id, 1)
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    assert sample(text, "memstore_chunks_finished_total", outcome="applied", writer="offline") >= 1
    assert sample(text, "memstore_writer_duration_seconds_count", writer="offline", outcome="ok") >= 1


RULES = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "memstore-rules.yml"


async def test_every_metric_the_prometheus_rules_read_is_one_memstore_serves(
    client: AsyncTestClient[Litestar],
) -> None:
    """The rules (deploy/prometheus) and `/metrics` cannot drift apart: a renamed or removed metric
    would leave an alert that can never fire."""
    served = set()
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            served.add(name)
            if kind == "histogram":
                served |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            elif kind == "counter" and not name.endswith("_total"):
                served.add(f"{name}_total")
    rules = yaml.safe_load(RULES.read_text())
    read = {
        name
        for group in rules["groups"]
        for rule in group["rules"]
        for name in re.findall(r"\bmemstore_[a-z_]+\b", rule["expr"])
    }
    assert read, "no metric found in the rules"
    assert read <= served, f"the rules read metrics /metrics does not serve: {sorted(read - served)}"
