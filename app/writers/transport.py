"""Calling an OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp's server, any provider).

One `ChatTransport` per configured writer and process: a pooled HTTP client with a cap on requests
in flight and retries with jittered backoff (`app.lib.http`, shared with the embedder), and
structured output where the server supports it: the JSON schema is sent as `response_format`, and a
server that rejects it is remembered and asked again without.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import structlog

from app.lib import metrics
from app.lib.http import RETRY_STATUSES, Endpoint, RetryPolicy
from app.writers.base import WriterError

log = structlog.get_logger(__name__)

ResponseFormat = Literal["auto", "json_schema", "json_object", "none"]


@dataclass(frozen=True)
class TransportConfig:
    """How to reach one model endpoint."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 30.0  # one HTTP request; the whole chunk is bounded by MEMSTORE_WRITER_TIMEOUT_S
    max_retries: int = 2
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    max_concurrency: int = 64
    temperature: float = 0.0
    response_format: ResponseFormat = "auto"
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request body


@dataclass(frozen=True)
class Completion:
    """One model answer with what it cost."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    attempts: int


class TransportError(WriterError):
    """The endpoint could not give an answer (after retries)."""


class ChatTransport:
    """Chat completions against one endpoint; safe to share between concurrent jobs of a process."""

    def __init__(self, config: TransportConfig, *, writer: str = "") -> None:
        self.config = config
        self.writer = writer or config.model
        self.endpoint = Endpoint(
            config.base_url,
            api_key=config.api_key,
            timeout_s=config.timeout_s,
            max_concurrency=config.max_concurrency,
        )
        self.retries = RetryPolicy(config.max_retries, config.backoff_s, config.backoff_max_s)
        # "auto" starts with the schema and drops it for good if the server refuses it.
        self._format: ResponseFormat = config.response_format

    async def aclose(self) -> None:
        await self.endpoint.aclose()

    def _body(
        self, messages: list[dict[str, str]], max_tokens: int, schema: dict[str, Any] | None, name: str
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
            "max_tokens": max_tokens,
        }
        if schema is not None and self._format in ("auto", "json_schema"):
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema},
            }
        elif self._format == "json_object":
            body["response_format"] = {"type": "json_object"}
        return {**body, **self.config.extra_body}

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        schema: dict[str, Any] | None = None,
        schema_name: str = "memory_ops",
    ) -> Completion:
        """The model's answer to `messages`; raises `TransportError` once retries are spent."""
        started = time.perf_counter()
        attempt = 0
        async with self.endpoint.slot():
            while True:
                attempt += 1
                body = self._body(messages, max_tokens, schema, schema_name)
                outcome, retry_after, detail = "ok", None, ""
                try:
                    answer = await self.endpoint.post("chat/completions", body)
                except TimeoutError:
                    outcome, detail = "timeout", f"no answer within {self.config.timeout_s:g} s"
                except aiohttp.ClientError as exc:
                    outcome, detail = "connect_error", f"{type(exc).__name__}: {exc}"
                else:
                    status = answer.status
                    if status == 200:
                        metrics.WRITER_REQUESTS.labels(self.writer, "ok").inc()
                        return _completion(answer.text, time.perf_counter() - started, attempt)
                    detail = f"HTTP {status}: {answer.text[:300]}"
                    if status in (400, 422) and "response_format" in body and self._format == "auto":
                        # The server does not do structured output; ask again in plain JSON prompting.
                        log.warning("writer.response_format_unsupported", writer=self.writer, detail=detail)
                        self._format = "none"
                        metrics.WRITER_REQUESTS.labels(self.writer, "format_rejected").inc()
                        attempt -= 1
                        continue
                    outcome = "http_429" if status == 429 else f"http_{status // 100}xx"
                    if status not in RETRY_STATUSES:
                        metrics.WRITER_REQUESTS.labels(self.writer, outcome).inc()
                        raise TransportError(f"writer endpoint refused the request ({detail})")
                    retry_after = answer.retry_after
                metrics.WRITER_REQUESTS.labels(self.writer, outcome).inc()
                if attempt > self.config.max_retries:
                    msg = f"writer endpoint failed after {attempt} attempts ({detail})"
                    raise TransportError(msg)
                wait = self.retries.wait_s(attempt, retry_after)
                log.info(
                    "writer.request_retry", writer=self.writer, attempt=attempt, wait_s=wait, reason=detail
                )
                await asyncio.sleep(wait)


def _completion(body: str, latency_s: float, attempts: int) -> Completion:
    try:
        payload = json.loads(body)
        choice = payload["choices"][0]
        text = choice["message"].get("content") or ""
        usage = payload.get("usage") or {}
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
        msg = "writer endpoint answered 200 with a body that is not a chat completion"
        raise TransportError(msg, raw_output=body[:20_000]) from exc
    return Completion(
        text=str(text),
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        latency_s=latency_s,
        attempts=attempts,
    )
