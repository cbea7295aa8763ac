"""A chat model over an OpenAI-compatible `/v1/chat/completions`: the read model that answers from
memories, and any other model asked one question at a time (an evaluation's judge).

Requests go over the writers' chat-completions client (`app.writers.transport`), unmetered, with no
`response_format`: temperature 0, a timeout per request, retries with jittered backoff on timeouts,
connection errors, 429 and 5xx, and a budget beyond the served context clamped to what fits. A request
refused outright (another 4xx) or answered with a body that is no chat completion is not retried:
asking again would get the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.config import Settings
from app.writers.transport import ChatTransport, TransportConfig, TransportError


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
        config = TransportConfig(
            base_url,
            model,
            api_key=api_key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            max_concurrency=max_concurrency,
            response_format="none",
        )
        self.transport = ChatTransport(config, writer=model, metered=False)

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int | None = None) -> Completion:
        """The model's answer to `messages`; raises `ChatModelError` when there is none."""
        try:
            answer = await self.transport.complete(
                messages, max_tokens=max_tokens or self.max_tokens, form="none"
            )
        except TransportError as exc:
            msg = f"the model at {self.base_url}: {exc}"
            raise ChatModelError(msg) from exc
        return Completion(
            text=answer.text.strip(),
            model=answer.model or self.model,
            prompt_tokens=answer.prompt_tokens,
            completion_tokens=answer.completion_tokens,
            latency_s=answer.latency_s,
        )

    async def aclose(self) -> None:
        await self.transport.aclose()


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
