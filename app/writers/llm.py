"""A writer backed by a memory model behind an OpenAI-compatible endpoint, speaking one profile."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.writers.base import WriteRequest, WriterError, WriteResult, storable_ops
from app.writers.profiles import ModelSession, Profile, get_profile
from app.writers.transport import ChatTransport, ResponseFormat, TransportConfig


@dataclass(frozen=True)
class LLMWriterSpec:
    """One configured LLM writer: a profile spoken to a model at an endpoint."""

    profile: str
    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 30.0
    max_retries: int = 2
    max_concurrency: int = 64
    max_tokens: int = 8192
    response_format: ResponseFormat = "auto"
    extra_body: dict[str, Any] = field(default_factory=dict)
    prompts_dir: Path | None = None
    context_messages: int | None = None  # None: what the profile's protocol shows


# Request fields a model family needs whatever protocol it is spoken to: Hy-Memory reasons before it
# answers unless told not to, and the reasoning eats the output budget (its framework says so too).
MODEL_FAMILIES: tuple[tuple[re.Pattern[str], dict[str, Any]], ...] = (
    (
        re.compile(r"hy[-_ ]?memory|hunyuan|\bhy3\b", re.IGNORECASE),
        {"chat_template_kwargs": {"reasoning_effort": "no_think"}},
    ),
)


def model_extra_body(model: str) -> dict[str, Any]:
    """The request fields the model's family needs (empty for any other model)."""
    return next((dict(extra) for pattern, extra in MODEL_FAMILIES if pattern.search(model)), {})


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        merged[key] = (
            _merge(merged[key], value)
            if isinstance(value, dict) and isinstance(merged.get(key), dict)
            else value
        )
    return merged


class LLMWriter:
    """Runs its profile against the model for each chunk; usage, prompt hash and raw output go on the
    changeset. A cut-off answer is asked again with a larger budget, then its complete items kept;
    unparseable output gets one repair request, then fails the attempt (see `ModelSession`);
    text no Postgres column can hold is taken out of the ops (`storable_ops`). A failure carries the
    usage of the calls made (`WriterError.usage`)."""

    initial_candidates = False  # every profile extracts first and retrieves for what it extracted

    def __init__(self, name: str, spec: LLMWriterSpec) -> None:
        self.name = name
        self.spec = spec
        self.model: str | None = spec.model
        self.profile_impl: Profile = get_profile(spec.profile, spec.prompts_dir)
        self.profile: str | None = self.profile_impl.name
        self.context_messages: int | None = (
            spec.context_messages if spec.context_messages is not None else self.profile_impl.context_messages
        )
        self.transport = ChatTransport(
            TransportConfig(
                base_url=spec.base_url,
                model=spec.model,
                api_key=spec.api_key,
                timeout_s=spec.timeout_s,
                max_retries=spec.max_retries,
                max_concurrency=spec.max_concurrency,
                response_format=spec.response_format,
                extra_body=_merge(model_extra_body(spec.model), spec.extra_body),
            ),
            writer=name,
            profile=self.profile,
        )

    @property
    def prompt_hash(self) -> str:
        return self.profile_impl.prompts.hash

    async def write(self, request: WriteRequest) -> WriteResult:
        session = ModelSession(self.transport, max_tokens_cap=self.spec.max_tokens)
        try:
            result = await self.profile_impl.write(request, session)
        except WriterError as exc:
            if session.transcript:  # what every call made for this chunk cost, failed or not
                exc.usage = session.usage()
            raise
        ops, unstorable = storable_ops(result.ops)
        return WriteResult(
            ops=ops,
            raw_output=session.raw_output(),
            prompt_hash=self.prompt_hash,
            usage=session.usage(),
            guards=result.guards + unstorable,
        )

    async def aclose(self) -> None:
        await self.transport.aclose()
