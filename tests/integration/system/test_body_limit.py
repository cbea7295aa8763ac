"""A body over the limit is answered 413 that the client actually reads — over a real socket, with
clients that send the whole body before they look at the answer (urllib, like `requests`)."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest
import uvicorn
from litestar import Litestar

from app.config import Settings
from app.server.asgi import create_app
from tests.conftest import TenantKeys
from tests.support.waiting import wait_for

FIVE_MB = 5 * 1024 * 1024


@pytest.fixture
async def base_url(settings: Settings) -> AsyncIterator[str]:
    app: Litestar = create_app(
        settings.model_copy(update={"max_body_bytes": 1_048_576}), configure_logs=False
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    await wait_for(lambda: server.started, timeout_s=60, what="the API listening")
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await task


def post_with_urllib(url: str, key: str, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def post_chunked(base_url: str, key: str, body: bytes) -> tuple[int, dict[str, object]]:
    host, port = base_url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        pieces = (body[i : i + 65536] for i in range(0, len(body), 65536))
        connection.request(
            "POST",
            "/v1/chunks",
            body=pieces,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            encode_chunked=True,
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def big_chunk() -> bytes:
    return json.dumps({"user_id": "u-1", "messages": [{"role": "user", "content": "x" * FIVE_MB}]}).encode()


async def test_a_client_that_sends_5_mb_reads_the_413(base_url: str, tenant: TenantKeys) -> None:
    status, body = await asyncio.to_thread(
        post_with_urllib, f"{base_url}/v1/chunks", tenant.admin_key, big_chunk()
    )
    assert status == 413
    assert body["error"]["code"] == "payload_too_large"  # type: ignore[index]


async def test_a_chunked_upload_over_the_limit_reads_the_413_too(base_url: str, tenant: TenantKeys) -> None:
    status, body = await asyncio.to_thread(post_chunked, base_url, tenant.admin_key, big_chunk())
    assert status == 413
    assert body["error"]["code"] == "payload_too_large"  # type: ignore[index]


async def test_the_same_connection_serves_a_good_request_after_a_refused_one(
    base_url: str, tenant: TenantKeys
) -> None:
    small = json.dumps(
        {"user_id": "u-1", "messages": [{"role": "user", "content": "I live in Lyon."}]}
    ).encode()
    status, _ = await asyncio.to_thread(
        post_with_urllib, f"{base_url}/v1/chunks", tenant.admin_key, big_chunk()
    )
    assert status == 413
    status, body = await asyncio.to_thread(post_with_urllib, f"{base_url}/v1/chunks", tenant.admin_key, small)
    assert status == 202, body
