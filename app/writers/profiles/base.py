"""What every profile shares: prompt templates, the model conversation of one chunk, JSON parsing.

A *profile* is one protocol spoken to a memory model (the prompts it was trained with and the JSON it
answers in), mapped onto our `Op`s. Prompts are template files (`app/writers/prompts/<profile>/`),
replaceable by an operator's directory; their hash goes on every changeset.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from app.writers.base import Candidate, Message, Op, WriteRequest, WriterError
from app.writers.transport import ChatTransport

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
T = TypeVar("T")

# Output that cannot be parsed gets one repair request; if that fails too, the chunk gets one more
# attempt (a fresh call may well succeed) and is then failed with the raw output kept. A deterministic
# model (temperature 0) that answers the repair with its first answer again would answer the retry the
# same, so that attempt is the chunk's last.
UNPARSEABLE_ATTEMPTS = 2
_REPAIR = (
    "Your reply could not be used: {error}. Reply again with the corrected JSON only, "
    "in exactly the format asked for, with no other text."
)


class ParseError(ValueError):
    """The model's answer is not the JSON its protocol asks for."""


class PromptSet:
    """A profile's prompt templates (`$name` placeholders), with one hash over all of them."""

    def __init__(self, profile: str, names: Sequence[str], override_dir: Path | None = None) -> None:
        self.texts: dict[str, str] = {}
        for name in names:
            path = PROMPTS_DIR / profile / f"{name}.txt"
            if override_dir is not None and (override_dir / profile / f"{name}.txt").is_file():
                path = override_dir / profile / f"{name}.txt"
            self.texts[name] = path.read_text(encoding="utf-8")
        canonical = json.dumps(sorted(self.texts.items()), ensure_ascii=False)
        self.hash = hashlib.sha256(canonical.encode()).hexdigest()

    def render(self, name: str, **values: str) -> str:
        try:
            return string.Template(self.texts[name]).substitute(values)
        except (KeyError, ValueError) as exc:
            msg = f"prompt template {name!r} has a placeholder that cannot be filled: {exc}"
            raise WriterError(msg) from exc


@dataclass
class ModelSession:
    """One chunk's exchange with the model: every call, its raw answer, tokens and time."""

    transport: ChatTransport
    max_tokens_cap: int
    transcript: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    repairs: int = 0

    async def ask(
        self,
        step: str,
        system: str,
        user: str,
        *,
        parse: Callable[[Any], T],
        schema: dict[str, Any] | None,
        max_tokens: int,
    ) -> T:
        """The parsed answer; one repair request if the first is unparseable, then `WriterError`."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        max_tokens = min(max_tokens, self.max_tokens_cap)
        text, finish = await self._call(step, messages, schema, max_tokens)
        try:
            return parse(parse_json(text, truncated=finish == "length"))
        except ParseError as first:
            self.repairs += 1
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": _REPAIR.format(error=first)},
            ]
            repaired, finish = await self._call(f"{step}.repair", messages, schema, max_tokens)
            try:
                return parse(parse_json(repaired, truncated=finish == "length"))
            except ParseError as second:
                limit = UNPARSEABLE_ATTEMPTS
                msg = f"unparseable {step} output after one repair request: {second}"
                if repaired.strip() == text.strip() and self.transport.deterministic:
                    limit = 1
                    msg += "; the model repeated its answer at temperature 0, so no retry can help"
                raise WriterError(
                    msg, raw_output=self.raw_output(), attempt_limit=limit, usage=self.usage()
                ) from second

    async def _call(
        self, step: str, messages: list[dict[str, str]], schema: dict[str, Any] | None, max_tokens: int
    ) -> tuple[str, str | None]:
        started = time.perf_counter()
        try:
            completion = await self.transport.complete(
                messages, max_tokens=max_tokens, schema=schema, schema_name=step.replace(".", "_")
            )
        except WriterError as exc:
            self.latency_s += time.perf_counter() - started
            self.transcript.append({"step": step, "error": str(exc), "output": exc.raw_output})
            exc.raw_output = self.raw_output()
            exc.usage = self.usage()
            raise
        self.latency_s += completion.latency_s
        self.prompt_tokens += completion.prompt_tokens
        self.completion_tokens += completion.completion_tokens
        self.transcript.append(
            {"step": step, "output": completion.text, "finish_reason": completion.finish_reason}
        )
        return completion.text, completion.finish_reason

    def raw_output(self) -> str:
        """Everything the model answered for this chunk, step by step, as JSON."""
        text = json.dumps(self.transcript, ensure_ascii=False)
        # A lone surrogate (from a JSON escape in the answer) has no UTF-8 form; it is kept as its
        # JSON escape, which is where it can only be: inside a string. NULs json.dumps escapes itself.
        return text.encode("utf-8", "backslashreplace").decode("utf-8")

    def usage(self) -> dict[str, Any]:
        """What the calls so far cost (`calls` counts failed ones too)."""
        return {
            "calls": len(self.transcript),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_ms": round(self.latency_s * 1000, 1),
            "repairs": self.repairs,
        }


@dataclass
class ProfileResult:
    ops: list[Op]
    guards: list[dict[str, Any]] = field(default_factory=list)


class Profile(Protocol):
    """A protocol spoken to a memory model."""

    name: str
    prompts: PromptSet
    context_messages: int  # earlier messages of the scope the protocol shows the model
    extra_body: dict[str, Any]  # request fields the protocol's models need (merged under the configured ones)

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult: ...


# --- formatting what the model is shown ------------------------------------------------------------


def format_messages(messages: Sequence[Message]) -> str:
    if not messages:
        return "(none)"
    lines = []
    for m in messages:
        when = f"[{m.created_at:%Y-%m-%d %H:%M}] " if m.created_at else ""
        who = f"{m.role} ({m.name})" if m.name else m.role
        lines.append(f"{when}{who}: {m.content}")
    return "\n".join(lines)


def format_date(value: datetime) -> str:
    return value.strftime("%Y-%m-%d")


def candidate_json(candidate: Candidate) -> dict[str, Any]:
    return {
        "memory_id": str(candidate.local_id),
        "content": candidate.content,
        "owner": candidate.owner,
        "memory_at": format_date(candidate.memory_at) if candidate.memory_at else None,
        "tags": list(candidate.tags),
    }


def local_id(value: Any) -> int | None:
    """A candidate id as the model wrote it ("3", 3), or None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def unknown_id_guard(index: int, op: str, value: Any) -> dict[str, Any]:
    return {"guard": "unknown_id", "op_index": index, "op": op, "detail": f"id {value!r} was not shown"}


# --- parsing what the model answered ---------------------------------------------------------------

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_json(text: str, *, truncated: bool = False) -> Any:
    """The JSON value in a model answer (tolerating a code fence or prose around one object/array)."""
    body = text.strip()
    if fenced := _FENCE.match(body):
        body = fenced.group(1)
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        pass
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if starts:
        try:
            value, _ = json.JSONDecoder().raw_decode(body[min(starts) :])
        except json.JSONDecodeError:
            pass
        else:
            return value
    if truncated:
        msg = "the answer was cut off at the token limit before the JSON was complete"
        raise ParseError(msg)
    msg = "the answer is not valid JSON" if body else "the answer is empty"
    raise ParseError(msg)


def expect_list(value: Any, key: str | None) -> list[Any]:
    """`value[key]` (or `value` itself when key is None) as a list."""
    if key is not None:
        if not isinstance(value, dict) or key not in value:
            msg = f'expected a JSON object with a "{key}" list'
            raise ParseError(msg)
        value = value[key]
    if not isinstance(value, list):
        msg = f'"{key}" must be a list' if key else "expected a JSON array"
        raise ParseError(msg)
    return value


def clean_tags(value: Any, limit: int = 3) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(str(t).strip().lower()[:50] for t in value if str(t).strip())[:limit]


def clean_owner(value: Any) -> str:
    return "agent" if value == "agent" else "user"
