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


async def test_each_call_asks_in_its_protocols_form_and_a_refused_json_object_falls_to_none(
    fake_llm: FakeLLM,
) -> None:
    """Under auto a call asks in the form its protocol names (hy-memory: nothing, Mem0: json_object,
    `simple`: its schema); a server refusing json_object moves the writer to sending nothing."""

    def refuse_json_object(body: dict[str, Any]) -> Reply:
        if body.get("response_format", {}).get("type") == "json_object":
            return Reply(status=400, body=REFUSAL.replace(b"json_schema", b"json_object"))
        return Reply.json({"memories": []})

    fake_llm.responder = refuse_json_object
    transport = ChatTransport(TransportConfig(base_url=fake_llm.base_url, model="m"), writer="w")
    hi = [{"role": "user", "content": "hi"}]
    try:
        await transport.complete(hi, max_tokens=10, form="none", schema=SCHEMA)
        await transport.complete(hi, max_tokens=10, form="json_object", schema=SCHEMA)
        await transport.complete(hi, max_tokens=10, form="json_schema", schema=SCHEMA)
    finally:
        await transport.aclose()
    assert [body.get("response_format", {}).get("type") for body in fake_llm.requests] == [
        None,  # the protocol's own: nothing
        "json_object",  # refused: the same request again with nothing
        None,
        None,  # json_object and above are refused for good: the schema is not sent either
    ]
    assert transport.structure == "none"


@pytest.mark.parametrize(
    "message",
    [
        # vLLM (and OpenAI) before 0.10, and after
        "This model's maximum context length is 16384 tokens. However, you requested 18384 tokens "
        "(10384 in the messages, 8000 in the completion). Please reduce the length of the messages.",
        "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is "
        "16384 tokens and your request has 10384 input tokens (8000 > 16384 - 10384).",
    ],
)
async def test_a_budget_beyond_the_served_context_is_clamped_to_what_fits(
    fake_llm: FakeLLM, message: str
) -> None:
    refusal = json.dumps({"object": "error", "message": message, "type": "BadRequestError", "code": 400})
    fake_llm.enqueue(Reply(status=400, body=refusal.encode()), Reply.json({"memories": []}))
    transport = ChatTransport(TransportConfig(base_url=fake_llm.base_url, model="m"), writer="w")
    try:
        completion = await transport.complete(
            [{"role": "user", "content": "hi"}], max_tokens=8000, form="none"
        )
    finally:
        await transport.aclose()
    assert completion.attempts == 1  # the refusal cost no attempt
    assert [body["max_tokens"] for body in fake_llm.requests] == [8000, 16384 - 10384]
