"""Calling an OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp's server, any provider): the
one chat-completions client, used by the writers and, unmetered, by the read model
(`app.domain.answer.reader`).

One `ChatTransport` per configured writer and process: a pooled HTTP client with a cap on requests
in flight and retries with jittered backoff (`app.lib.http`, shared with the embedder), and
structured output where the server supports it. The tokens of every answer are counted here
(`memstore_writer_tokens_total`), whether or not its chunk is then applied.

Each call names the `response_format` its protocol uses (its *form*): nothing, `json_object`, or a
JSON schema. With the writer's setting `auto`, that form is sent, and a server that refuses a form
moves the writer one rung down the ladder `json_schema` -> the schema inside `json_object` (how
llama.cpp and llama-cpp-python take one) -> plain `json_object` -> nothing, for good in this process;
the request is sent again at once in the next form. Only an error that is about the `response_format`
itself moves the writer down; any other refusal fails that call alone. Concurrent calls refused at
once move the writer down one rung, not one each. Any other setting sends that form on every call.

A request longer than the served context allows (prompt + max_tokens) is refused by vLLM and OpenAI
with the numbers in the error; it is sent again at once with max_tokens clamped to what fits.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import aiohttp
import structlog

from app.lib import metrics, tracing
from app.lib.http import RETRY_STATUSES, Endpoint, RetryPolicy
from app.writers.base import WriterError, storable_text

log = structlog.get_logger(__name__)

# What is sent as `response_format`; "json_object_schema" is `{"type": "json_object", "schema": S}`
# (llama.cpp's server and llama-cpp-python enforce it by grammar), "json_object" is any JSON.
Structure = Literal["json_schema", "json_object_schema", "json_object", "none"]
# The setting: one of those forms for good, or `auto`.
ResponseFormat = Literal["auto", "json_schema", "json_object_schema", "json_object", "none"]
RESPONSE_FORMATS: tuple[ResponseFormat, ...] = get_args(ResponseFormat)
# `auto`: each refusal of one form moves the writer to the next.
AUTO_FALLBACK: dict[Structure, Structure] = {
    "json_schema": "json_object_schema",
    "json_object_schema": "json_object",
    "json_object": "none",
}
_LADDER: tuple[Structure, ...] = ("json_schema", "json_object_schema", "json_object", "none")
# A request whose prompt and max_tokens exceed the served context, as vLLM and OpenAI word it.
CONTEXT_LIMIT = re.compile(r"maximum context length is (\d+)", re.IGNORECASE)
PROMPT_TOKENS = re.compile(r"(\d+) (?:tokens )?in the messages|has (\d+) input tokens", re.IGNORECASE)


def _weaker(a: Structure, b: Structure) -> Structure:
    """The form lower on the ladder (the one that asks less of the server)."""
    return a if _LADDER.index(a) >= _LADDER.index(b) else b


def _fitting_max_tokens(error: str) -> int | None:
    """From a context-length refusal, the largest max_tokens that fits; None if it names no numbers."""
    limit, prompt = CONTEXT_LIMIT.search(error), PROMPT_TOKENS.search(error)
    if limit is None or prompt is None:
        return None
    return int(limit.group(1)) - int(prompt.group(1) or prompt.group(2))


# How servers say that they cannot do the `response_format` asked for. Matched against the error body;
# each pattern names the format, so an error that only echoes the request (a validation error that
# quotes the body) or is about something else (the context length) does not match.
FORMAT_REFUSAL = re.compile(
    "|".join(
        (
            r"'response_format' of type '\w+' is not supported",  # OpenAI, a model without json_schema
            r"to use 'response_format'",  # OpenAI: json_object needs the word JSON in the messages
            r"\"param\":\s*\"response_format\"",  # OpenAI, any other refusal of the field
            r"response_format type must be one of",  # llama.cpp's server (400, older builds 500)
            r"input should be 'text' or 'json_object'",  # llama-cpp-python (500); vLLM before json_schema
            r"response_format\W+(?:is )?not (?:supported|allowed)",  # OpenAI-compatible gateways
            r"unsupported response_format",
            r"json schema|structured output|guided decoding|grammar",  # a schema the server cannot compile
        )
    ),
    re.IGNORECASE,
)


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
    prompt_tokens: int | None  # None: the server did not say
    completion_tokens: int | None
    latency_s: float
    attempts: int
    model: str | None = None  # as the server names it


class TransportError(WriterError):
    """The endpoint could not give an answer (after retries)."""


class ChatTransport:
    """Chat completions against one endpoint; safe to share between concurrent jobs of a process."""

    def __init__(
        self, config: TransportConfig, *, writer: str = "", metered: bool = True, profile: str | None = None
    ) -> None:
        self.config = config
        self.writer = writer or config.model
        self.profile = profile  # the protocol spoken, named on the call's span
        self.metered = metered  # counted in the writer metrics (a writer's calls are; the reader's not)
        self.endpoint = Endpoint(
            config.base_url,
            api_key=config.api_key,
            timeout_s=config.timeout_s,
            max_concurrency=config.max_concurrency,
        )
        self.retries = RetryPolicy(config.max_retries, config.backoff_s, config.backoff_max_s)
        mode = config.response_format
        if mode not in RESPONSE_FORMATS:
            allowed = ", ".join(RESPONSE_FORMATS)
            msg = f"writer {self.writer!r}: response_format must be one of {allowed}, not {mode!r}"
            raise ValueError(msg)
        self.auto = mode == "auto"
        # Under `auto`, the strongest form this server has not refused; otherwise the one configured.
        self.structure: Structure = "json_schema" if mode == "auto" else mode

    @property
    def deterministic(self) -> bool:
        """Whether the model samples at temperature 0, so that the same request gets the same answer."""
        temperature = self.config.extra_body.get("temperature", self.config.temperature)
        return isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature == 0

    async def aclose(self) -> None:
        await self.endpoint.aclose()

    def _body(
        self,
        messages: list[dict[str, str]],
        max_tokens: int,
        structure: Structure,
        schema: dict[str, Any] | None,
        name: str,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
            "max_tokens": max_tokens,
        }
        if structure == "json_object":
            body["response_format"] = {"type": "json_object"}
        elif schema is not None and structure == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
        elif schema is not None and structure == "json_object_schema":
            body["response_format"] = {"type": "json_object", "schema": schema}
        return {**body, **self.config.extra_body}

    def _count_tokens(self, completion: Completion) -> None:
        """Tokens are counted per call, as they are spent: a chunk that later fails cost them too."""
        for kind, count in (
            ("prompt", completion.prompt_tokens),
            ("completion", completion.completion_tokens),
        ):
            if count and self.metered:
                metrics.WRITER_TOKENS.labels(self.writer, self.config.model, kind).inc(count)

    def _counted(self, outcome: str) -> None:
        if self.metered:
            metrics.WRITER_REQUESTS.labels(self.writer, outcome).inc()

    def _fall_back(self, refused: Structure, detail: str) -> None:
        """The server refused `refused` for what it is: nothing stronger than the next form is sent
        from now on. A call refused concurrently with another that already moved it lower does not
        move it again."""
        lower = _weaker(self.structure, AUTO_FALLBACK[refused])
        if lower == self.structure:
            return
        self.structure = lower
        log.warning(
            "writer.response_format_refused",
            writer=self.writer,
            refused=refused,
            now=self.structure,
            detail=detail,
        )

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        form: Structure = "json_schema",
        schema: dict[str, Any] | None = None,
        schema_name: str = "memory_ops",
    ) -> Completion:
        """The model's answer to `messages`, asked in `form` (the protocol's response_format; the
        writer's setting overrides it unless `auto`); raises `TransportError` once retries are spent.
        With tracing on, the call is a GenAI client span (`chat {model}`)."""
        if not tracing.ENABLED:
            return await self._complete(messages, max_tokens, form, schema, schema_name)
        with tracing.span(
            f"chat {self.config.model}", self._request_attributes(messages), kind="CLIENT"
        ) as span:
            try:
                completion = await self._complete(messages, max_tokens, form, schema, schema_name)
            except Exception as exc:
                tracing.fail(span, exc)
                raise
            if span is not None:
                span.set_attributes(_response_attributes(completion))
            return completion

    def _request_attributes(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",  # the API spoken: vLLM and the others serve OpenAI's
            "gen_ai.request.model": self.config.model,
            "gen_ai.request.temperature": self.config.temperature,
            "server.address": urlsplit(self.config.base_url).hostname,
            "memstore.writer": self.writer,
            "memstore.writer.profile": self.profile,
        }
        if tracing.CAPTURE_CONTENT:
            attributes["gen_ai.input.messages"] = json.dumps(messages, ensure_ascii=False)
        return attributes

    async def _complete(
        self,
        messages: list[dict[str, str]],
        max_tokens: int,
        form: Structure,
        schema: dict[str, Any] | None,
        schema_name: str,
    ) -> Completion:
        started = time.perf_counter()
        attempt = 0
        clamped = False
        async with self.endpoint.slot():
            while True:
                attempt += 1
                structure = _weaker(form, self.structure) if self.auto else self.structure
                body = self._body(messages, max_tokens, structure, schema, schema_name)
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
                        self._counted("ok")
                        completion = _completion(answer.text, time.perf_counter() - started, attempt)
                        self._count_tokens(completion)
                        return completion
                    detail = f"HTTP {status}: {storable_text(answer.text[:300])}"
                    if "response_format" in body and FORMAT_REFUSAL.search(answer.text):
                        self._counted("format_rejected")
                        if self.auto and structure in AUTO_FALLBACK:
                            # Not an attempt at the answer: the same request again, in the next form.
                            self._fall_back(structure, detail)
                            attempt -= 1
                            continue
                        msg = (
                            f"the endpoint refused the response_format it was sent ({detail}); "
                            "set the writer's response_format to auto or to a form it supports"
                        )
                        raise TransportError(msg)
                    fitting = _fitting_max_tokens(answer.text) if status == 400 and not clamped else None
                    if fitting is not None and 0 < fitting < max_tokens:
                        # Not an attempt at the answer: the same request with a budget that fits.
                        self._counted("context_clamped")
                        log.info(
                            "writer.max_tokens_clamped", writer=self.writer, asked=max_tokens, now=fitting
                        )
                        max_tokens, clamped = fitting, True
                        attempt -= 1
                        continue
                    outcome = "http_429" if status == 429 else f"http_{status // 100}xx"
                    if status not in RETRY_STATUSES:
                        self._counted(outcome)
                        raise TransportError(f"the endpoint refused the request ({detail})")
                    retry_after = answer.retry_after
                self._counted(outcome)
                if attempt > self.config.max_retries:
                    msg = f"the endpoint failed after {attempt} attempts ({detail})"
                    raise TransportError(msg)
                wait = self.retries.wait_s(attempt, retry_after)
                log.info(
                    "writer.request_retry", writer=self.writer, attempt=attempt, wait_s=wait, reason=detail
                )
                await asyncio.sleep(wait)


def _response_attributes(completion: Completion) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.response.model": completion.model,
        "gen_ai.usage.input_tokens": completion.prompt_tokens,
        "gen_ai.usage.output_tokens": completion.completion_tokens,
        "gen_ai.response.finish_reasons": [completion.finish_reason] if completion.finish_reason else None,
        "memstore.writer.attempts": completion.attempts,
    }
    if tracing.CAPTURE_CONTENT:
        attributes["gen_ai.output.messages"] = completion.text
    return attributes


def _completion(body: str, latency_s: float, attempts: int) -> Completion:
    try:
        payload = json.loads(body)
        choice = payload["choices"][0]
        text = choice["message"].get("content") or ""
        usage = payload.get("usage") or {}
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
        msg = "the endpoint answered 200 with a body that is not a chat completion"
        raise TransportError(msg, raw_output=body[:20_000]) from exc
    model = payload.get("model")
    return Completion(
        text=str(text),
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=_count(usage, "prompt_tokens"),
        completion_tokens=_count(usage, "completion_tokens"),
        latency_s=latency_s,
        attempts=attempts,
        model=model if isinstance(model, str) and model else None,
    )


def _count(usage: Any, key: str) -> int | None:
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
