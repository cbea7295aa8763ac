"""Writers that stand in for a misbehaving or slow model. They wrap the real offline writer, and are
loaded by workers through the `MEMSTORE_WRITER_PLUGINS` setting, as an operator's own writer would be.
"""

from __future__ import annotations

import asyncio
import os

from app.writers.base import WriteRequest, WriterError, WriteResult
from app.writers.offline import OfflineWriter

FAIL_MARKER = "boom"


class SlowWriter(OfflineWriter):
    """The offline writer behind a model-like latency (`MEMSTORE_TEST_WRITER_DELAY_S`, default 0.05 s).

    Also counts how many calls are in flight at once, per process, to observe cross-scope parallelism.
    """

    in_flight = 0
    max_in_flight = 0

    def __init__(self, name: str = "slow") -> None:
        super().__init__(name=name)
        self.delay_s = float(os.environ.get("MEMSTORE_TEST_WRITER_DELAY_S", "0.05"))

    async def write(self, request: WriteRequest) -> WriteResult:
        cls = type(self)
        cls.in_flight += 1
        cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
        try:
            await asyncio.sleep(self.delay_s)  # a model's latency: time itself must pass
            return await super().write(request)
        finally:
            cls.in_flight -= 1


class FailingWriter(OfflineWriter):
    """Fails (as a model returning garbage would) on any chunk that mentions `boom`."""

    def __init__(self, name: str = "failing") -> None:
        super().__init__(name=name)

    async def write(self, request: WriteRequest) -> WriteResult:
        if any(FAIL_MARKER in m.content for m in request.messages):
            raise WriterError("output is not valid JSON", raw_output='{"memory": [')
        return await super().write(request)


class ContextProbeWriter:
    """Writes nothing; reports what it was shown (earlier messages, candidates) in the changeset's usage."""

    model = None
    profile = None
    context_messages: int | None = None  # the deployment's MEMSTORE_CONTEXT_MESSAGES

    def __init__(self, name: str = "probe") -> None:
        self.name = name

    async def write(self, request: WriteRequest) -> WriteResult:
        return WriteResult(
            ops=[],
            usage={
                "context": [m.content for m in request.context],
                "candidates": [[c.local_id, c.content] for c in request.candidates],
            },
        )


PLUGINS = {
    "slow": "tests.support.writers:SlowWriter",
    "failing": "tests.support.writers:FailingWriter",
    "probe": "tests.support.writers:ContextProbeWriter",
}
