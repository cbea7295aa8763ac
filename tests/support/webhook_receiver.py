"""A webhook receiver for tests: an aiohttp server on 127.0.0.1 that verifies every delivery with the
`standardwebhooks` package (the reference implementation of the scheme), and records what arrived.

It can be stopped and started again on the same port (a receiver down for a while), and told to
answer an error status instead of 204.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.support.waiting import wait_for


@dataclass
class Delivery:
    """A delivery that arrived and verified."""

    webhook_id: str
    type: str
    data: dict[str, Any]
    timestamp: str


@dataclass
class WebhookReceiver:
    port: int = 0
    secret: str | None = None  # set once the endpoint is created
    status: int = 204  # what it answers a verified delivery
    received: list[Delivery] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # why deliveries failed verification
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.secret is None:
            self.refused.append("no secret yet")
            return web.Response(status=500)
        try:
            payload = Webhook(self.secret).verify(body, dict(request.headers))
        except WebhookVerificationError as exc:
            self.refused.append(str(exc))
            return web.Response(status=400)
        if self.status >= 300:
            return web.Response(status=self.status)
        parsed = json.loads(body)
        assert parsed == payload
        self.received.append(
            Delivery(request.headers["webhook-id"], parsed["type"], parsed["data"], parsed["timestamp"])
        )
        return web.Response(status=204)

    async def start(self) -> None:
        if self.port == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
        app = web.Application()
        app.router.add_post("/hooks", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Delivery]:
        """Once at least `count` deliveries have arrived (AssertionError after `timeout_s`)."""
        await wait_for(
            self.types,
            lambda types: len(types) >= count,
            timeout_s=timeout_s,
            what=f"{count} deliveries at the receiver",
        )
        return self.received

    def types(self, user_id: str | None = None) -> list[str]:
        return [d.type for d in self.received if user_id is None or d.data.get("user_id") == user_id]
