"""The Grafana dashboard (deploy/grafana/memstore.json) shows data: a real Prometheus scrapes a live
Memstore (the API on a socket, a worker, the fake model server as writer and embedder) and evaluates
deploy/prometheus/memstore-rules.yml; after real traffic, every panel's every query answers at least
one series, and no rule fails to evaluate. A renamed metric or recording rule, a label a query groups
by that no series has, a query Prometheus refuses: each fails here, all of them listed."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import Settings
from tests.conftest import FAST_WORKERS, TenantKeys, bearer, make_tenant, writers_toml
from tests.support.fake_llm import FakeLLM, Reply, protocol_responder
from tests.support.live import live_api
from tests.support.prometheus import (
    DASHBOARD,
    PROMETHEUS,
    Prometheus,
    PromQLError,
    dashboard_targets,
    running_prometheus,
)
from tests.support.waiting import wait_for
from tests.support.workers import running_worker, wait_for_chunks, wait_until

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no `prometheus` binary on PATH (Debian's: apt-get install prometheus; `make rules` installs it)",
)


# Each kind of failure the panels show, which the traffic must have caused (not a 0 series).
FAILURES = (
    "sum(memstore_embedder_failures_total)",
    'sum(memstore_chunks_finished_total{outcome="failed"})',
    'sum(memstore_writer_requests_total{outcome!="ok"})',
    "sum(memstore_guards_fired_total)",
    'sum(memstore_ingest_rejected_total{reason="rate_limited"})',
    'sum(memstore_http_requests_total{status=~"4.."})',
)


class Model:
    """The writers' model: cooperative, except for chunks that carry a marker. `flaky`: its first
    request answers 500 (the writer's transport retries it); `placeholder`: one memory is a stand-in
    ("The user ...", dropped by a guard); `garbage`: never JSON (the chunk fails)."""

    def __init__(self) -> None:
        self.flaked = False

    def __call__(self, body: dict[str, Any]) -> Reply:
        text = json.dumps(body["messages"])
        if "garbage" in text:
            return Reply(content="Sure! The user seems nice; nothing else to add.")
        if "flaky" in text and not self.flaked:
            self.flaked = True
            return Reply(status=500)
        if "placeholder" in text:
            return Reply.json({"memories": ["The user said: placeholder.", "The user ..."]})
        return protocol_responder(body)


async def _drive(http: httpx.AsyncClient, tenant: TenantKeys) -> int:
    """Ingestion of every kind (accepted, refused 429, invalid, unauthenticated); returns the chunks
    accepted."""
    response = await http.post(
        "/v1/admin/keys", json={"name": "app", "roles": ["ingest", "read"]}, headers=tenant.admin
    )
    assert response.status_code == 201, response.text
    key = bearer(response.json()["key"])
    # A shadow writer: every chunk also goes to a bank of its own (the dashboard's shadow lag).
    response = await http.patch(
        "/v1/admin/settings", json={"shadow_writers": ["trial"]}, headers=tenant.admin
    )
    assert response.status_code == 200, response.text

    accepted = 0
    texts = [f"I live in city number {i}." for i in range(6)] + [
        "Note flaky: I play chess.",
        "Note placeholder: I like tea.",
        "Note garbage: I own a boat.",
    ]
    for i, text in enumerate(texts):
        body = {"user_id": f"u{i}", "messages": [{"role": "user", "content": text}]}
        response = await http.post("/v1/chunks", json=body, headers=key)
        assert response.status_code == 202, response.text
        accepted += 1
    # One user over its rate (a burst of 3): 429 `rate_limited`.
    statuses = []
    for i in range(6):
        body = {"user_id": "chatty", "messages": [{"role": "user", "content": f"Message {i}."}]}
        statuses.append((await http.post("/v1/chunks", json=body, headers=key)).status_code)
    assert 429 in statuses, statuses
    accepted += statuses.count(202)
    # The client's mistakes: a body the API refuses, and no key.
    assert (await http.post("/v1/chunks", json={"user_id": "x"}, headers=key)).status_code in (400, 422)
    assert (await http.post("/v1/chunks", json={"user_id": "x", "messages": []})).status_code == 401
    return accepted


async def _spend_a_budget(http: httpx.AsyncClient, tenant: TenantKeys) -> list[str]:
    """A tenant with a daily token budget of one token: its first chunk spends it, its second waits (the
    per-tenant panels: chunks waiting, the oldest's age, the budget spent). The chunks' ids."""
    response = await http.patch("/v1/admin/settings", json={"daily_token_budget": 1}, headers=tenant.admin)
    assert response.status_code == 200, response.text
    ids = []
    for text in ("I live in Porto.", "I like sardines."):
        body = {"user_id": "frugal", "messages": [{"role": "user", "content": text}]}
        response = await http.post("/v1/chunks", json=body, headers=tenant.admin)
        assert response.status_code == 202, response.text
        ids.append(response.json()["chunk_id"])
    return ids


async def _search(http: httpx.AsyncClient, tenant: TenantKeys, fake: FakeLLM) -> None:
    for i in range(6):
        body = {"user_id": f"u{i}", "query": f"Where does the user live? {i}"}
        response = await http.post("/v1/memories/search", json=body, headers=tenant.admin)
        assert response.status_code == 200, response.text
    # The embeddings server fails once: whatever the search answers, the embedder counts a failed run.
    fake.embedding_script.append(Reply(status=500, body=b'{"error": {"message": "down"}}'))
    body = {"user_id": "u0", "query": "A query no one embedded before."}
    await http.post("/v1/memories/search", json=body, headers=tenant.admin)


async def _offenders(prometheus: Prometheus, targets: list[tuple[str, str]]) -> list[str]:
    found = []
    for title, expr in targets:
        try:
            if not await prometheus.query(expr):
                found.append(f"{title}: no series: {expr}")
        except PromQLError as exc:
            found.append(f"{title}: {exc}: {expr}")
    return found + [f"rule: {error}" for error in await prometheus.rule_errors()]


async def test_every_panel_of_the_dashboard_has_data(
    settings: Settings,
    tenant: TenantKeys,
    sessionmaker: async_sessionmaker[AsyncSession],
    tmp_path: Path,
) -> None:
    targets = dashboard_targets(json.loads(DASHBOARD.read_text()))
    assert len(targets) > 30, "the dashboard lost its panels"
    async with FakeLLM(responder=Model()) as fake:
        writers = tmp_path / "writers.toml"
        fields = {"profile": "simple", "base_url": fake.base_url, "timeout_s": 2.0, "max_retries": 1}
        writers.write_text(
            writers_toml({"primary": {**fields, "model": "m1"}, "trial": {**fields, "model": "m2"}})
        )
        live = settings.model_copy(
            update={
                **FAST_WORKERS,
                "writers_file": writers,
                "writer": "primary",
                "max_attempts": 1,
                "embedder": "openai",
                "embedder_base_url": fake.base_url,
                "embedder_max_retries": 0,
                "user_rate_limit_per_s": 0.1,
                "user_rate_limit_burst": 3,
                "worker_max_jobs": 8,
                "shadow_max_jobs": 2,
            }
        )
        async with (
            live_api(live) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as http,
            running_prometheus(url, tmp_path) as prometheus,
            running_worker(live),
        ):
            accepted = await _drive(http, tenant)
            await wait_for_chunks(sessionmaker, tenant.tenant_id, accepted, timeout_s=30)
            await _search(http, tenant, fake)
            frugal = await make_tenant(sessionmaker, "frugal")
            _, waiting = await _spend_a_budget(http, frugal)
            await wait_for(
                lambda: http.get(f"/v1/chunks/{waiting}", headers=frugal.admin),
                lambda r: r.json().get("waiting_for") == "daily_token_budget",
                timeout_s=30,
                what="the second chunk waiting for the budget",
            )

            # Rates need two samples of a series (a failure counted last, too); the rules a few
            # evaluations after that.
            done = time.time()
            await wait_until(lambda: prometheus.scraped_after(done + 3), 20, "three more scrapes")
            offenders: list[str] = []

            async def all_answer() -> bool:
                nonlocal offenders
                offenders = await _offenders(prometheus, targets)
                return not offenders

            with contextlib.suppress(AssertionError):  # the offenders, listed below, say more
                await wait_until(all_answer, 15, "every panel's series")
            happened: dict[str, float] = {}
            for expr in FAILURES:
                found = await prometheus.query(expr)
                happened[expr] = float(found[0]["value"][1]) if found else 0.0
    assert not offenders, "dashboard queries without data:\n" + "\n".join(offenders)
    assert all(happened.values()), happened
