"""A chat model over an OpenAI-compatible `/v1/chat/completions`: the read model that answers from
memories, and any other model asked one question at a time (an evaluation's judge).

Requests go over the shared pooled client and retry policy of `app.lib.http`: temperature 0, a
timeout per request, retries with jittered backoff on timeouts, connection errors, 429 and 5xx.
A request refused outright (another 4xx) or answered with a body that is no chat completion is not
retried: asking again would get the same answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import structlog

from app.config import Settings
from app.lib.http import RETRY_STATUSES, TRANSIENT_ERRORS, Endpoint, RetryPolicy

log = structlog.get_logger(__name__)

_DETAIL_CHARS = 300


class ChatModelError(RuntimeError):
    """The model gave no usable answer (after retries, or refused the request)."""


@dataclass(frozen=True)
class Completion:
    """One answer of the model, with what it cost."""

    text: str
    model: str  # as the server names it, else the name asked for
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float

    def usage(self) -> dict[str, Any]:
        total = None
        if self.prompt_tokens is not None and self.completion_tokens is not None:
            total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
            "latency_ms": round(self.latency_s * 1000, 1),
        }


class ChatModel:
    """One model at one endpoint; safe to share between concurrent tasks."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        max_tokens: int = 512,
        max_retries: int = 2,
        max_concurrency: int = 32,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.endpoint = Endpoint(
            base_url, api_key=api_key, timeout_s=timeout_s, max_concurrency=max_concurrency
        )
        self.retries = RetryPolicy(max_retries=max_retries)

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int | None = None) -> Completion:
        """The model's answer to `messages`; raises `ChatModelError` when there is none."""
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": max_tokens or self.max_tokens,
        }
        started = time.perf_counter()
        attempt = 0
        async with self.endpoint.slot():
            while True:
                attempt += 1
                retry_after = None
                try:
                    answer = await self.endpoint.post("chat/completions", body)
                except TimeoutError:
                    detail = f"no answer within {self.timeout_s:g} s"
                except TRANSIENT_ERRORS as exc:
                    detail = f"{type(exc).__name__}: {exc}"
                else:
                    if answer.status == 200:
                        return _completion(answer.text, self.model, time.perf_counter() - started)
                    detail = f"HTTP {answer.status}: {answer.text[:_DETAIL_CHARS]}"
                    if answer.status not in RETRY_STATUSES:
                        msg = f"the model at {self.base_url} refused the request ({detail})"
                        raise ChatModelError(msg)
                    retry_after = answer.retry_after
                if attempt > self.retries.max_retries:
                    msg = f"the model at {self.base_url} failed after {attempt} attempts ({detail})"
                    raise ChatModelError(msg)
                wait = self.retries.wait_s(attempt, retry_after)
                log.info("chat_model.retry", model=self.model, attempt=attempt, wait_s=wait, reason=detail)
                await asyncio.sleep(wait)

    async def aclose(self) -> None:
        await self.endpoint.aclose()


def _completion(body: str, asked_for: str, latency_s: float) -> Completion:
    try:
        payload = json.loads(body)
        choice = payload["choices"][0]
        text = choice["message"].get("content") or ""
        usage = payload.get("usage") or {}
        model = payload.get("model") or asked_for
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
        msg = f"the model answered 200 with a body that is not a chat completion: {body[:_DETAIL_CHARS]!r}"
        raise ChatModelError(msg) from exc
    return Completion(
        text=str(text).strip(),
        model=str(model),
        prompt_tokens=_count(usage, "prompt_tokens"),
        completion_tokens=_count(usage, "completion_tokens"),
        latency_s=latency_s,
    )


def _count(usage: Any, key: str) -> int | None:
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def reader_from_settings(settings: Settings) -> ChatModel | None:
    """The read model of MEMSTORE_READER_*, or None when it is not configured."""
    if not settings.reader_base_url or not settings.reader_model:
        return None
    return ChatModel(
        settings.reader_base_url,
        settings.reader_model,
        api_key=settings.reader_api_key,
        timeout_s=settings.reader_timeout_s,
        max_tokens=settings.reader_max_tokens,
    )
