"""The MCP server at /mcp, driven by the `mcp` package's own client over streamable HTTP against the
real API on a real socket, with a real worker writing the memories."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from app.config import Settings
from tests.conftest import TenantKeys, bearer
from tests.support.live import live_api
from tests.support.waiting import wait_for
from tests.support.workers import running_worker

TOOLS = {
    "add_memory",
    "search_memories",
    "get_memories",
    "get_memory",
    "explain_memory",
    "delete_memory",
    "memory_history",
}


@pytest.fixture
async def base_url(settings: Settings) -> AsyncIterator[str]:
    async with live_api(settings) as url, running_worker(settings) as worker:
        # Started before the test runs: a test over before the worker's start-up (which loads the
        # language model) would stop it half-started, and its shut-down would then skip the clients its
        # start-up had opened, left to this session's event loop.
        await wait_for(lambda: "pipeline" in worker.ctx, timeout_s=60, what="the worker started")
        yield url


@contextlib.asynccontextmanager
async def mcp_client(base_url: str, key: str, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's client on /mcp, sending `key` as the REST API's clients do; `mode` `auto` speaks the
    newest protocol the server offers, `legacy` the handshake-era one (initialize, then requests)."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    transport = streamable_http_client(f"{base_url}/mcp", http_client=http)
    async with http, Client(transport, mode=mode) as client:
        yield client


async def make_key(base_url: str, tenant: TenantKeys, *roles: str) -> str:
    async with httpx.AsyncClient(base_url=base_url) as http:
        response = await http.post(
            "/v1/admin/keys", json={"name": "-".join(roles), "roles": list(roles)}, headers=tenant.admin
        )
    assert response.status_code == 201, response.text
    return str(response.json()["key"])


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    """A tool's structured answer; fails the test on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """The REST error body of a tool call that must be refused."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    body: dict[str, Any] = result.structured_content
    assert set(body["error"]) == {"code", "message", "details"}
    return body["error"]


async def wait_applied(base_url: str, tenant: TenantKeys, chunk_ids: list[str]) -> None:
    async with httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http:

        async def states() -> list[str]:
            found = [(await http.get(f"/v1/chunks/{c}")).json()["status"] for c in chunk_ids]
            assert "failed" not in found
            return found

        await wait_for(
            states,
            lambda found: all(s == "applied" for s in found),
            timeout_s=30,
            what=f"chunks {chunk_ids} applied",
        )


def said(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_client_lists_the_seven_tools_with_their_arguments(
    base_url: str, tenant: TenantKeys, mode: str
) -> None:
    reader = await make_key(base_url, tenant, "read")
    async with mcp_client(base_url, reader, mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == TOOLS
        add = tools["add_memory"].input_schema
        assert add["required"] == ["user_id", "messages"]
        assert {"user_id", "agent_id", "run_id", "messages", "idempotency_key"} <= set(add["properties"])
        assert add["properties"]["messages"]["items"]["properties"]["role"]["enum"] == [
            "assistant",
            "system",
            "tool",
            "user",
        ]
        assert tools["search_memories"].input_schema["properties"]["top_k"]["maximum"] == 100
        assert tools["get_memory"].input_schema["required"] == ["memory_id"]
        assert tools["delete_memory"].annotations is not None
        assert tools["delete_memory"].annotations.destructive_hint
        templates = (await client.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["memstore://users/{user_id}/memories"]
        # Each call is the key's own, whichever protocol carried it.
        assert (await call(client, "get_memories", user_id="ana")) == {"items": [], "next_cursor": None}
        error = await refused(client, "add_memory", user_id="ana", messages=said("I live in Lyon."))
        assert error["code"] == "forbidden"


async def test_each_tool_against_memories_a_worker_wrote(base_url: str, tenant: TenantKeys) -> None:
    async with mcp_client(base_url, tenant.admin_key) as client:
        lyon = await call(
            client,
            "add_memory",
            user_id="ana",
            agent_id="coach",
            run_id="s-1",
            messages=said("I live in Lyon."),
        )
        assert lyon["status"] == "queued"
        assert lyon["seq"] == 1
        seattle = await call(
            client, "add_memory", user_id="ana", messages=said("I moved to Seattle last month.")
        )
        python = await call(client, "add_memory", user_id="ana", messages=said("I mainly use Python."))
        await wait_applied(base_url, tenant, [lyon["chunk_id"], seattle["chunk_id"], python["chunk_id"]])

        page = await call(client, "get_memories", user_id="ana")
        assert sorted(m["content"] for m in page["items"]) == [
            "The user lives in Seattle.",
            "The user mainly uses Python.",
        ]
        every = await call(client, "get_memories", user_id="ana", status="all")
        old = next(m for m in every["items"] if m["content"] == "The user lives in Lyon.")
        assert old["status"] == "superseded"
        assert (old["agent_id"], old["run_id"]) == ("coach", "s-1")

        found = await call(
            client, "search_memories", user_id="ana", query="which city does the user live in", top_k=1
        )
        [best] = found["results"]
        assert best["memory"]["content"] == "The user lives in Seattle."

        one = await call(client, "get_memory", memory_id=old["id"])
        assert one == old

        history = await call(client, "memory_history", memory_id=old["id"])
        assert [v["op"] for v in history["versions"]] == ["ADD", "SUPERSEDE"]
        assert history["versions"][0]["chunk_id"] == lyon["chunk_id"]

        explained = await call(client, "explain_memory", memory_id=old["id"])
        assert explained["memory"]["id"] == old["id"]
        first = explained["versions"][0]
        assert first["source"]["chunk_id"] == lyon["chunk_id"]
        assert first["source"]["messages"][0]["content"] == "I live in Lyon."

        python_memory = next(m for m in page["items"] if m["content"] == "The user mainly uses Python.")
        deleted = await call(client, "delete_memory", memory_id=python_memory["id"], reason="asked to forget")
        assert (deleted["status"], deleted["version"]) == ("deleted", 2)
        after = await call(client, "memory_history", memory_id=python_memory["id"])
        assert [(v["op"], v["reason"]) for v in after["versions"]][-1] == ("DELETE", "asked to forget")
        assert after["versions"][-1]["actor"].startswith("key:")

        # The resource of a user's memories: the active ones, as get_memories lists them.
        resource = await client.read_resource("memstore://users/ana/memories")
        [contents] = resource.contents
        assert '"The user lives in Seattle."' in contents.text
        assert "Python" not in contents.text

    # The same answers the REST API gives.
    async with httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http:
        rest = (await http.get(f"/v1/memories/{old['id']}/history")).json()
        assert rest == history


async def test_a_key_without_the_role_is_refused_with_the_rest_code(
    base_url: str, tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    reader = await make_key(base_url, tenant, "read")
    async with mcp_client(base_url, reader) as client:
        error = await refused(client, "add_memory", user_id="ana", messages=said("I live in Lyon."))
        assert error["code"] == "forbidden"
        assert "ingest" in error["message"]
        # Refused before its arguments are read, as a route's guards run before its body is.
        assert (await refused(client, "delete_memory", memory_id="not-an-id"))["code"] == "forbidden"
        assert (await call(client, "get_memories", user_id="ana"))["items"] == []
    async with httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http:
        chunks = (await http.get("/v1/admin/chunks", params={"status": "all"})).json()
        assert chunks["items"] == []  # nothing was stored

    ingester = await make_key(base_url, tenant, "ingest")
    async with mcp_client(base_url, ingester) as client:
        accepted = await call(client, "add_memory", user_id="ana", messages=said("I live in Lyon."))
        assert (await refused(client, "search_memories", user_id="ana", query="Lyon"))["code"] == "forbidden"
        await wait_applied(base_url, tenant, [accepted["chunk_id"]])
    async with mcp_client(base_url, tenant.admin_key) as client:
        [memory] = (await call(client, "get_memories", user_id="ana"))["items"]
        # Another tenant's memory does not exist for this one's key.
        async with mcp_client(base_url, other_tenant.admin_key) as other:
            assert (await refused(other, "get_memory", memory_id=memory["id"]))["code"] == "not_found"
            assert (await refused(other, "delete_memory", memory_id=memory["id"]))["code"] == "not_found"
    # An agent's delete meets the tenant's destructive-ops policy, as a writer model's ops do.
    writer = await make_key(base_url, tenant, "write")
    async with httpx.AsyncClient(base_url=base_url, headers=tenant.admin) as http:
        for policy in ("deny", "review"):
            assert (
                await http.patch("/v1/admin/settings", json={"destructive_ops": policy})
            ).status_code == 200
            async with mcp_client(base_url, writer) as client:
                error = await refused(client, "delete_memory", memory_id=memory["id"])
            assert error["code"] == "destructive_op_refused"
            assert error["details"] == {"policy": policy, "op": "DELETE"}
            assert (await http.get(f"/v1/memories/{memory['id']}")).json()["status"] == "active"
        assert (await http.patch("/v1/admin/settings", json={"destructive_ops": None})).status_code == 200
    # A key that may delete but not read is answered the new version without the text, as over REST.
    async with mcp_client(base_url, writer) as client:
        assert (await refused(client, "get_memory", memory_id=memory["id"]))["code"] == "forbidden"
        deleted = await call(client, "delete_memory", memory_id=memory["id"])
        assert deleted == {
            "id": memory["id"],
            "status": "deleted",
            "version": 2,
            "updated_at": deleted["updated_at"],
        }
    async with mcp_client(base_url, ingester) as client:
        with pytest.raises(MCPError) as raised:
            await client.read_resource("memstore://users/ana/memories")
        assert raised.value.data["error"]["code"] == "forbidden"


async def test_arguments_are_checked_as_the_rest_bodies_are(base_url: str, tenant: TenantKeys) -> None:
    async with mcp_client(base_url, tenant.admin_key) as client:
        error = await refused(client, "add_memory", user_id="ana", messages=[])
        assert error["code"] == "validation_error"
        error = await refused(client, "add_memory", user_id="ana", messages=said("hi"), writer="nope")
        assert (error["code"], error["details"]["field"]) == ("validation_error", "writer")
        error = await refused(client, "search_memories", query="x")  # no user_id and not all_users
        assert error["code"] == "validation_error"
        error = await refused(client, "get_memories", user_id="ana", as_of="2026-01-01T00:00:00")  # no zone
        assert error["code"] == "validation_error"
        assert (await refused(client, "get_memory", memory_id=str(uuid.uuid4())))["code"] == "not_found"


async def test_a_missing_or_unknown_key_is_refused(base_url: str) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=base_url) as http:
        for auth in ({}, bearer("ms_" + "x" * 40), {"Authorization": "Basic abc"}):
            response = await http.post("/mcp", json=initialize, headers=headers | auth)
            assert response.status_code == 401, response.text
            assert response.json()["error"]["code"] == "unauthorized"
    with pytest.raises(Exception):  # noqa: B017, PT011  # the SDK's own error for a 401, whatever its class
        async with mcp_client(base_url, "ms_" + "x" * 40) as client:
            await client.list_tools()


async def test_mcp_is_not_a_rest_route_of_the_document(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url) as http:
        document = (await http.get("/schema/openapi.json")).json()
        assert not [path for path in document["paths"] if path.startswith("/mcp")]
        preflight = await http.options("/mcp")
        assert preflight.status_code == 204
        assert preflight.headers["allow"] == "POST"
