"""Mem0's own client (`mem0ai` 2.2.1, `MemoryClient` and `AsyncMemoryClient`) against a live Memstore with
`MEMSTORE_MEM0_COMPAT=true` and a real worker (the offline writer): every call it makes, each result
checked in Memstore's native API — chunks, memories, versions, changesets — and a Mem0-side update and
delete reverted through the native admin API."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

os.environ.setdefault("MEM0_TELEMETRY", "false")  # before mem0 is imported: no calls home

import httpx
import pytest
from mem0 import AsyncMemoryClient, MemoryClient

from app.config import Settings
from tests.conftest import TenantKeys, bearer
from tests.support.live import live_api
from tests.support.waiting import wait_for, wait_for_sync
from tests.support.workers import running_worker


@pytest.fixture
async def base_url(settings: Settings) -> AsyncIterator[str]:
    async with live_api(settings.model_copy(update={"mem0_compat": True})) as url, running_worker(settings):
        yield url


def wait_event(client: MemoryClient, event_id: str, timeout_s: float = 60) -> dict[str, Any]:
    event: dict[str, Any] = wait_for_sync(
        lambda: client.client.get(f"/v1/event/{event_id}/").raise_for_status().json(),
        lambda event: event["status"] in ("SUCCEEDED", "FAILED"),
        timeout_s=timeout_s,
        what=f"event {event_id} finished",
    )
    return dict(event)


def native(url: str, key: str, method: str, path: str, **kwargs: Any) -> Any:
    response = httpx.request(method, url + path, headers=bearer(key), timeout=30, **kwargs)
    assert response.status_code < 300, response.text
    return response.json()


async def test_the_mem0_client_runs_every_call_against_memstore_and_each_lands_in_history(
    base_url: str, tenant: TenantKeys
) -> None:
    def scenario() -> None:
        key = tenant.admin_key
        client = MemoryClient(api_key=key, host=base_url)  # GET /v1/ping/ at construction
        assert client.org_id == client.project_id == str(tenant.tenant_id)

        # add -> a chunk, answered at once; its event follows the chunk to SUCCEEDED with what it wrote.
        added = client.add(
            [{"role": "user", "content": "I live in Lyon."}, {"role": "assistant", "content": "Noted."}],
            user_id="ana",
            agent_id="helper",
            metadata={"channel": "web"},
        )
        assert added["status"] == "PENDING"
        event_id = added["event_id"]
        chunk = native(base_url, key, "GET", f"/v1/chunks/{event_id}")
        assert chunk["user_id"] == "ana"
        assert chunk["agent_id"] == "helper"
        assert chunk["metadata"] == {"channel": "web"}
        event = wait_event(client, event_id)
        assert event["status"] == "SUCCEEDED", event
        [result] = event["results"]
        assert result["event"] == "ADD"
        assert result["data"]["memory"] == "The user lives in Lyon."
        lyon_id = result["id"]
        chunk = native(base_url, key, "GET", f"/v1/chunks/{event_id}")
        assert chunk["status"] == "applied"
        changeset = native(base_url, key, "GET", f"/v1/admin/changesets/{chunk['changeset_id']}")
        assert [op.get("memory_id") for op in changeset["ops"]] == [lyon_id]

        # infer=False stores each message as it was said (the verbatim writer), through the same queue.
        verbatim = client.add("Remember the blue notebook", user_id="ana", infer=False)
        event = wait_event(client, verbatim["event_id"])
        assert event["status"] == "SUCCEEDED", event
        assert [r["data"]["memory"] for r in event["results"]] == ["Remember the blue notebook"]
        notebook_id = event["results"][0]["id"]
        chunk = native(base_url, key, "GET", f"/v1/chunks/{verbatim['event_id']}")
        assert chunk["writer"] == "verbatim"
        third = client.add("I'm vegetarian.", user_id="ana")
        assert wait_event(client, third["event_id"])["status"] == "SUCCEEDED"
        bo = client.add("I mainly use Python.", user_id="bo")
        assert wait_event(client, bo["event_id"])["status"] == "SUCCEEDED"

        # get_all and search, against the native list.
        listed = client.get_all(filters={"user_id": "ana"}, page=1, page_size=2)
        assert listed["count"] == 3
        assert len(listed["results"]) == 2
        assert listed["next"] is not None
        assert listed["previous"] is None
        second = client.get_all(filters={"user_id": "ana"}, page=2, page_size=2)
        assert second["next"] is None
        every = {m["memory"] for m in listed["results"] + second["results"]}
        items = native(base_url, key, "GET", "/v1/memories?user_id=ana")["items"]
        assert every == {m["content"] for m in items}
        assert every == {"The user lives in Lyon.", "Remember the blue notebook", "The user is vegetarian."}
        found = client.search("where does the user live", filters={"user_id": "ana"}, top_k=1)
        [best] = found["results"]
        assert best["memory"] == "The user lives in Lyon."
        assert best["score"] > 0
        assert best["user_id"] == "ana"
        everyone = client.search("python", filters={"user_id": "*"}, top_k=5)
        assert "The user mainly uses Python." in [r["memory"] for r in everyone["results"]]

        # get, update, history: the update is version 2 of the memory, a hand edit.
        assert client.get(lyon_id)["memory"] == "The user lives in Lyon."
        updated = client.update(lyon_id, text="The user lives in Paris.")
        assert updated["memory"] == "The user lives in Paris."
        assert updated["version"] == 2
        history = client.history(lyon_id)
        assert [(h["event"], h["old_memory"], h["new_memory"]) for h in history] == [
            ("ADD", None, "The user lives in Lyon."),
            ("UPDATE", "The user lives in Lyon.", "The user lives in Paris."),
        ]
        versions = native(base_url, key, "GET", f"/v1/memories/{lyon_id}/history")["versions"]
        assert [(v["op"], v["content"]) for v in versions] == [
            ("ADD", "The user lives in Lyon."),
            ("UPDATE", "The user lives in Paris."),
        ]
        assert versions[1]["actor"].startswith("key:")
        edit = native(base_url, key, "GET", f"/v1/admin/changesets/{versions[1]['changeset_id']}")
        assert edit["kind"] == "manual"

        # Revert the Mem0-side update through the native admin API: the old text is back.
        native(base_url, key, "POST", f"/v1/admin/changesets/{versions[1]['changeset_id']}/revert", json={})
        assert native(base_url, key, "GET", f"/v1/memories/{lyon_id}")["content"] == "The user lives in Lyon."

        # delete: soft, a DELETE version; gone for Mem0 (404), there and revertible for Memstore.
        assert "deleted" in client.delete(notebook_id)["message"]
        with pytest.raises(Exception, match="No such memory") as refused:
            client.get(notebook_id)
        assert type(refused.value).__name__ == "MemoryNotFoundError"
        gone = native(base_url, key, "GET", f"/v1/memories/{notebook_id}")
        assert gone["status"] == "deleted"
        versions = native(base_url, key, "GET", f"/v1/memories/{notebook_id}/history")["versions"]
        assert [v["op"] for v in versions] == ["ADD", "DELETE"]
        native(base_url, key, "POST", f"/v1/admin/changesets/{versions[1]['changeset_id']}/revert", json={})
        back = native(base_url, key, "GET", f"/v1/memories/{notebook_id}")
        assert (back["status"], back["content"]) == ("active", "Remember the blue notebook")

        # batch update and batch delete: one hand edit each, whole or nothing.
        ids = [m["id"] for m in native(base_url, key, "GET", "/v1/memories?user_id=ana")["items"]]
        client.batch_update([{"memory_id": i, "text": f"fact number {n}"} for n, i in enumerate(ids)])
        contents = {
            m["id"]: m["content"] for m in native(base_url, key, "GET", "/v1/memories?user_id=ana")["items"]
        }
        assert contents == {i: f"fact number {n}" for n, i in enumerate(ids)}
        with pytest.raises(Exception, match="No such memory"):
            client.batch_update(
                [{"memory_id": ids[0], "text": "never"}, {"memory_id": str(uuid.uuid4()), "text": "x"}]
            )
        assert native(base_url, key, "GET", f"/v1/memories/{ids[0]}")["content"] == "fact number 0"
        client.batch_delete([{"memory_id": ids[0]}, {"memory_id": ids[1]}])
        left = native(base_url, key, "GET", "/v1/memories?user_id=ana")["items"]
        assert [m["id"] for m in left] == [ids[2]]
        deleted = native(base_url, key, "GET", f"/v1/memories/{ids[0]}/history")["versions"][-1]
        assert deleted["op"] == "DELETE"
        batch = native(base_url, key, "GET", f"/v1/admin/changesets/{deleted['changeset_id']}")
        assert sorted(op["memory_id"] for op in batch["ops"]) == sorted(ids[:2])

        # entities, feedback (kept in the audit log), delete_all.
        entities = client.users()
        assert {(e["type"], e["name"]) for e in entities["results"]} >= {("user", "ana"), ("user", "bo")}
        client.feedback(ids[2], feedback="POSITIVE", feedback_reason="right")
        audit = native(base_url, key, "GET", "/v1/admin/audit?action=memory.feedback")
        assert [e["target_id"] for e in audit["items"]] == [ids[2]]
        client.delete_all(user_id="ana")
        assert native(base_url, key, "GET", "/v1/memories?user_id=ana")["items"] == []
        assert client.get_all(filters={"user_id": "ana"})["count"] == 0
        client.delete_users(user_id="bo")
        assert native(base_url, key, "GET", "/v1/memories?user_id=bo")["items"] == []
        every_status = native(base_url, key, "GET", "/v1/memories?user_id=bo&status=all")["items"]
        assert [m["status"] for m in every_status] == ["deleted"]  # soft: history keeps it

    await asyncio.to_thread(scenario)


async def test_the_mem0_client_reads_when_each_fact_held(base_url: str, tenant: TenantKeys) -> None:
    """Ana lived in Lyon (said in 2020), then "moved to Berlin last month" (said on 10 March 2024, UTC):
    Berlin held from 1 February, Lyon until then. Mem0 has no valid time; its client reads Memstore's as
    extra keys of each memory and each history entry."""
    moved = "2024-02-01T00:00:00Z"

    def scenario() -> None:
        client = MemoryClient(api_key=tenant.admin_key, host=base_url)
        said = (
            ("I live in Lyon.", "2020-01-05T10:00:00+00:00"),
            ("I moved to Berlin last month.", "2024-03-10T09:00:00+00:00"),
        )
        for text, at in said:
            added = client.add(text, user_id="ana", timestamp=int(datetime.fromisoformat(at).timestamp()))
            assert wait_event(client, added["event_id"])["status"] == "SUCCEEDED"

        [berlin] = client.get_all(filters={"user_id": "ana"})["results"]
        assert berlin["memory"] == "The user lives in Berlin."
        assert (berlin["valid_from"], berlin["valid_to"]) == (moved, None)
        [hit] = client.search("where does the user live", filters={"user_id": "ana"}, top_k=1)["results"]
        assert (hit["id"], hit["valid_from"], hit["valid_to"]) == (berlin["id"], moved, None)
        assert client.get(berlin["id"])["valid_from"] == moved

        # Lyon, replaced: still answered by id (only a deleted memory is gone for Mem0), closed by the move.
        items = native(base_url, tenant.admin_key, "GET", "/v1/memories?user_id=ana&status=all")["items"]
        lyon_id = next(m["id"] for m in items if m["content"] == "The user lives in Lyon.")
        lyon = client.get(lyon_id)
        assert (lyon["status"], lyon["valid_from"], lyon["valid_to"]) == ("superseded", None, moved)
        assert [(h["op"], h["valid_to"]) for h in client.history(lyon_id)] == [
            ("ADD", None),
            ("SUPERSEDE", moved),
        ]

    await asyncio.to_thread(scenario)


async def test_the_async_mem0_client_runs_the_same_flow(base_url: str, tenant: TenantKeys) -> None:
    key = tenant.admin_key
    # The async client pings with `requests` at construction: build it off the event loop.
    client = await asyncio.to_thread(AsyncMemoryClient, api_key=key, host=base_url)
    async with client:
        added = await client.add("I live in Lyon.", user_id="cy")

        async def event_of_the_add() -> dict[str, Any]:
            found: dict[str, Any] = (await client.async_client.get(f"/v1/event/{added['event_id']}/")).json()
            return found

        event = await wait_for(
            event_of_the_add,
            lambda event: event["status"] in ("SUCCEEDED", "FAILED"),
            timeout_s=60,
            what="the add's event finished",
        )
        assert event["status"] == "SUCCEEDED", event
        memory_id = event["results"][0]["id"]
        listed = await client.get_all(filters={"user_id": "cy"})
        assert [m["id"] for m in listed["results"]] == [memory_id]
        [hit] = (await client.search("Lyon", filters={"user_id": "cy"}, top_k=1))["results"]
        assert hit["id"] == memory_id
        assert (await client.get(memory_id))["memory"] == "The user lives in Lyon."
        await client.update(memory_id, text="The user lives in Oslo.")
        assert [h["event"] for h in await client.history(memory_id)] == ["ADD", "UPDATE"]
        await client.batch_update([{"memory_id": memory_id, "text": "The user lives in Rome."}])
        await client.delete(memory_id)
        async with httpx.AsyncClient(base_url=base_url, headers=bearer(key)) as memstore:
            versions = (await memstore.get(f"/v1/memories/{memory_id}/history")).json()["versions"]
            assert [v["op"] for v in versions] == ["ADD", "UPDATE", "UPDATE", "DELETE"]
            rollback = await memstore.post(
                f"/v1/admin/memories/{memory_id}/rollback", json={"to_version": 2, "reason": "undo"}
            )
            assert rollback.status_code == 200, rollback.text
            restored = (await memstore.get(f"/v1/memories/{memory_id}")).json()
            assert (restored["status"], restored["content"]) == ("active", "The user lives in Oslo.")
        await client.batch_delete([{"memory_id": memory_id}])
        await client.delete_all(user_id="cy")
        assert (await client.get_all(filters={"user_id": "cy"}))["count"] == 0
