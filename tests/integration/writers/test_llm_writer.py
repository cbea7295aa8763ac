"""The LLM writer on its own against the fake model server: what a failed chunk says about itself."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from app.writers.base import Message, WriteRequest, WriterError
from app.writers.llm import LLMWriter, LLMWriterSpec
from app.writers.profiles.base import UNPARSEABLE_ATTEMPTS
from tests.support.fake_llm import FakeLLM, Reply

STUCK = '{"memory": "The user ..."}'


def _request(text: str = "I live in Oslo.") -> WriteRequest:
    now = datetime(2026, 11, 1, 10, tzinfo=UTC)
    return WriteRequest(
        user_id="u", messages=(Message("user", text),), context=(), candidates=(), memory_at=now, now=now
    )


async def _failure(fake: FakeLLM, **spec: Any) -> WriterError:
    writer = LLMWriter("w", LLMWriterSpec(profile="simple", base_url=fake.base_url, model="m", **spec))
    try:
        with pytest.raises(WriterError) as failed:
            await writer.write(_request())
    finally:
        await writer.aclose()
    return failed.value


@pytest.mark.parametrize(
    ("extra_body", "attempt_limit"),
    [({}, 1), ({"temperature": 0}, 1), ({"temperature": 0.7}, UNPARSEABLE_ATTEMPTS)],
)
async def test_the_same_unusable_answer_to_the_repair_ends_the_chunk_only_at_temperature_0(
    fake_llm: FakeLLM, extra_body: dict[str, Any], attempt_limit: int
) -> None:
    fake_llm.responder = lambda body: Reply(content=STUCK)
    error = await _failure(fake_llm, extra_body=extra_body)
    assert error.attempt_limit == attempt_limit
    assert len(fake_llm.requests) == 2


async def test_a_different_unusable_answer_to_the_repair_leaves_the_chunk_its_retry(
    fake_llm: FakeLLM,
) -> None:
    fake_llm.enqueue(Reply(content=STUCK), Reply(content='{"memories": "The user ..."}'))
    error = await _failure(fake_llm)
    assert error.attempt_limit == UNPARSEABLE_ATTEMPTS


def _tokens(writer: str, kind: str) -> float:
    labels = {"writer": writer, "model": "m", "kind": kind}
    return REGISTRY.get_sample_value("memstore_writer_tokens_total", labels) or 0.0


async def test_a_failed_chunk_says_what_its_calls_cost_and_their_tokens_are_counted(
    fake_llm: FakeLLM,
) -> None:
    fake_llm.responder = lambda body: Reply(content=STUCK)
    before = {kind: _tokens("w", kind) for kind in ("prompt", "completion")}
    error = await _failure(fake_llm)
    # the fake server's usage: a token per four characters of each message and of the answer
    prompt = sum(len(m["content"]) // 4 for body in fake_llm.requests for m in body["messages"])
    assert error.usage["calls"] == 2
    assert error.usage["repairs"] == 1
    assert error.usage["prompt_tokens"] == prompt > 0
    assert error.usage["completion_tokens"] == 2 * (len(STUCK) // 4)
    assert error.usage["latency_ms"] > 0
    assert _tokens("w", "prompt") - before["prompt"] == prompt
    assert _tokens("w", "completion") - before["completion"] == 2 * (len(STUCK) // 4)


async def test_a_call_the_endpoint_refused_is_in_the_usage_of_the_failure(fake_llm: FakeLLM) -> None:
    fake_llm.enqueue(Reply(status=400, body=b'{"error": {"message": "bad parameter"}}'))
    error = await _failure(fake_llm)
    assert "refused the request" in str(error)
    assert (error.usage["calls"], error.usage["prompt_tokens"], error.usage["completion_tokens"]) == (1, 0, 0)
