"""Valid time through the MCP tools, driven by the `mcp` package's client against the real API and a real
worker: each memory and version shows when its fact held, and `get_memories` / `search_memories` take
`valid_at` as their REST routes do."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import TenantKeys
from tests.integration.mcp.test_mcp_server import base_url, call, mcp_client, wait_applied

__all__ = ["base_url"]  # the live API and its worker, as test_mcp_server starts them

LIVES = "The user lives in Lyon."
MOVED = "The user lives in Seattle."


def said_on(text: str, at: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text, "created_at": at}]


async def test_memories_show_when_they_held_and_the_reads_take_valid_at(
    base_url: str, tenant: TenantKeys
) -> None:
    async with mcp_client(base_url, tenant.admin_key) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert "valid_at" in tools["get_memories"].input_schema["properties"]
        assert "valid_at" in tools["search_memories"].input_schema["properties"]

        lyon = await call(
            client, "add_memory", user_id="ana", messages=said_on("I live in Lyon.", "2020-01-05T10:00:00Z")
        )
        await wait_applied(base_url, tenant, [lyon["chunk_id"]])
        seattle = await call(
            client,
            "add_memory",
            user_id="ana",
            messages=said_on("I moved to Seattle.", "2024-03-10T09:00:00Z"),
        )
        await wait_applied(base_url, tenant, [seattle["chunk_id"]])

        # Now: Seattle, open since the move; every memory object carries its validity.
        [now] = (await call(client, "get_memories", user_id="ana"))["items"]
        assert (now["content"], now["valid_to"]) == (MOVED, None)
        assert "valid_from" in now

        # In 2022 Lyon held, replaced since: get_memories and search_memories both say so.
        [then] = (await call(client, "get_memories", user_id="ana", valid_at="2022-06-01T00:00:00Z"))["items"]
        assert (then["content"], then["status"]) == (LIVES, "superseded")
        assert then["valid_to"] == "2024-03-10T09:00:00Z"
        found = await call(
            client,
            "search_memories",
            user_id="ana",
            query="Where does the user live?",
            valid_at="2022-06-01T00:00:00Z",
        )
        assert [r["memory"]["content"] for r in found["results"]] == [LIVES]
        assert found["results"][0]["memory"]["valid_to"] == "2024-03-10T09:00:00Z"
        found = await call(
            client,
            "search_memories",
            user_id="ana",
            query="Where does the user live?",
            valid_at="2025-01-01T00:00:00Z",
        )
        assert [r["memory"]["content"] for r in found["results"]] == [MOVED]
        assert (await call(client, "get_memories", user_id="ana", valid_at="2019-06-01T00:00:00Z"))[
            "items"
        ] == []

        # One memory, its history and its explanation: open, then closed by the SUPERSEDE.
        assert (await call(client, "get_memory", memory_id=then["id"]))["valid_to"] == "2024-03-10T09:00:00Z"
        history = await call(client, "memory_history", memory_id=then["id"])
        assert [(v["op"], v["valid_to"]) for v in history["versions"]] == [
            ("ADD", None),
            ("SUPERSEDE", "2024-03-10T09:00:00Z"),
        ]
        explained = await call(client, "explain_memory", memory_id=then["id"])
        assert explained["memory"]["valid_to"] == "2024-03-10T09:00:00Z"
        assert [v["version"]["valid_to"] for v in explained["versions"]] == [None, "2024-03-10T09:00:00Z"]

    # The same answer the REST route gives.
    async with httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http:
        rest = await http.get("/v1/memories", params={"user_id": "ana", "valid_at": "2022-06-01T00:00:00Z"})
        rest_items: list[dict[str, Any]] = rest.json()["items"]
        assert rest_items == [then]
