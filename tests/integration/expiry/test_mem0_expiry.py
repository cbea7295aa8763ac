"""Mem0's `expiration_date` through Mem0's own client (`mem0ai` 2.2.1) against the compatible routes: an
add's date makes the memories it writes expire after that day, an update sets or clears it, and an
expired memory leaves `get_all` and `search` unless `show_expired` asks for it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

os.environ.setdefault("MEM0_TELEMETRY", "false")  # before mem0 is imported: no calls home

import httpx
import pytest
from mem0 import MemoryClient

from app.config import Settings
from tests.conftest import TenantKeys, bearer
from tests.support.live import live_api
from tests.support.waiting import wait_for_sync
from tests.support.workers import running_worker


@pytest.fixture
async def base_url(settings: Settings) -> AsyncIterator[str]:
    async with live_api(settings.model_copy(update={"mem0_compat": True})) as url, running_worker(settings):
        yield url


def _added(client: MemoryClient, text: str, **options: Any) -> str:
    event_id = client.add(text, user_id="ana", **options)["event_id"]
    event = wait_for_sync(
        lambda: client.client.get(f"/v1/event/{event_id}/").raise_for_status().json(),
        lambda event: event["status"] in ("SUCCEEDED", "FAILED"),
        timeout_s=60,
        what=f"event {event_id} finished",
    )
    assert event["status"] == "SUCCEEDED", event
    [result] = event["results"]
    return str(result["id"])


def _native(url: str, key: str, method: str, path: str, **kwargs: Any) -> Any:
    response = httpx.request(method, url + path, headers=bearer(key), timeout=30, **kwargs)
    assert response.status_code < 300, response.text
    return response.json()


async def test_mem0_expiration_dates_hide_memories_and_undo_brings_them_back(
    base_url: str, tenant: TenantKeys
) -> None:
    def scenario() -> None:
        key = tenant.admin_key
        client = MemoryClient(api_key=key, host=base_url)
        lyon = _added(client, "I live in Lyon.", expiration_date="2099-12-31")
        assert client.get(lyon)["expiration_date"] == "2099-12-31"
        memory = _native(base_url, key, "GET", f"/v1/memories/{lyon}")
        assert memory["expires_at"] == "2100-01-01T00:00:00Z"
        chunk = _native(base_url, key, "GET", f"/v1/memories/{lyon}/history")["versions"][0]["chunk_id"]
        assert _native(base_url, key, "GET", f"/v1/chunks/{chunk}")["metadata"] == {
            "expiration_date": "2099-12-31"
        }
        past = _added(client, "I'm vegetarian.", expiration_date="2020-01-31")
        assert client.get(past)["expiration_date"] == "2020-01-31"
        python = _added(client, "I mainly use Python.")
        assert client.get(python)["expiration_date"] is None

        def listed(**options: Any) -> set[str]:
            return {m["memory"] for m in client.get_all(filters={"user_id": "ana"}, **options)["results"]}

        def found(**options: Any) -> set[str]:
            hits = client.search("what does the user eat", filters={"user_id": "ana"}, top_k=5, **options)
            return {m["memory"] for m in hits["results"]}

        live = {"The user lives in Lyon.", "The user mainly uses Python."}
        assert listed() == live
        assert listed(show_expired=True) == live | {"The user is vegetarian."}
        assert "The user is vegetarian." not in found()
        assert "The user is vegetarian." in found(show_expired=True)

        # An update sets the date (a hand edit: a version), and a revert of it brings the memory back.
        updated = client.update(python, expiration_date="2021-06-30")
        assert (updated["expiration_date"], updated["version"]) == ("2021-06-30", 2)
        assert listed() == {"The user lives in Lyon."}
        changeset = _native(base_url, key, "GET", f"/v1/memories/{python}/history")["versions"][1]
        assert changeset["expires_at"] == "2021-07-01T00:00:00Z"
        _native(base_url, key, "POST", f"/v1/admin/changesets/{changeset['changeset_id']}/revert", json={})
        assert listed() == live
        # ... and `expiration_date=None` clears one.
        cleared = client.update(past, expiration_date=None)
        assert (cleared["expiration_date"], cleared["version"]) == (None, 2)
        assert listed() == live | {"The user is vegetarian."}
        with pytest.raises(Exception, match="does not match the schema"):
            client.update(lyon, expiration_date="next week")

    await asyncio.to_thread(scenario)
