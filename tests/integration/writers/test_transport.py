"""The transport against the fake model server: how it reads a refusal of the response_format."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from app.writers.transport import ChatTransport, TransportConfig, TransportError
from tests.support.fake_llm import FakeLLM, Reply

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"memories": {"type": "array"}}}
REFUSAL = json.dumps(
    {
        "error": {
            "message": 'response_format type must be one of "text" or "json_object", but got: json_schema'
        }
    }
).encode()


def _refuse_json_schema(body: dict[str, Any]) -> Reply:
    if body["response_format"]["type"] == "json_schema":
        return Reply(status=400, body=REFUSAL, delay_s=0.2)  # long enough for every call to be sent first
    return Reply.json({"memories": []})


async def test_concurrent_refusals_move_the_writer_down_one_form(fake_llm: FakeLLM) -> None:
    fake_llm.responder = _refuse_json_schema
    transport = ChatTransport(TransportConfig(base_url=fake_llm.base_url, model="m"), writer="w")
    try:
        await asyncio.gather(
            *(
                transport.complete([{"role": "user", "content": "hi"}], max_tokens=10, schema=SCHEMA)
                for _ in range(8)
            )
        )
    finally:
        await transport.aclose()
    assert transport.structure == "json_object_schema"  # not plain json_object, nor none
    sent = [body["response_format"] for body in fake_llm.requests]
    assert sent.count({"type": "json_object", "schema": SCHEMA}) == 8


async def test_a_fixed_format_that_is_refused_fails_at_once(fake_llm: FakeLLM) -> None:
    fake_llm.responder = _refuse_json_schema
    config = TransportConfig(base_url=fake_llm.base_url, model="m", response_format="json_schema")
    transport = ChatTransport(config, writer="w")
    try:
        with pytest.raises(TransportError, match="refused the response_format"):
            await transport.complete([{"role": "user", "content": "hi"}], max_tokens=10, schema=SCHEMA)
    finally:
        await transport.aclose()
    assert len(fake_llm.requests) == 1
    assert transport.structure == "json_schema"
