"""What every profile shares: its prompt texts, the model conversation of one chunk, JSON parsing.

A *profile* is one protocol spoken to a memory model (the messages its reference framework sends and
the JSON it answers in), mapped onto our `Op`s. The reference profiles' texts come from the pinned
reference packages (`app.writers.references`); Memstore's own `simple` protocol keeps its texts in
`app/writers/prompts/simple/`. An operator may replace any text by name; the hash of the texts a
profile speaks goes on every changeset.

`ModelSession` runs one chunk's calls: the message list each profile builds is sent as it is, in the
`response_format` its reference uses. An answer cut off at the token limit is sent again once with a
larger budget; if that is cut off too, the complete items of it are kept (`salvage_json`) and the
rest is lost, as recorded in `usage`. Output that cannot be read at all gets one repair request, then
fails the attempt.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from app.writers.base import Op, WriteRequest, WriterError
from app.writers.transport import ChatTransport, Structure

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
T = TypeVar("T")
ChatMessages = list[dict[str, str]]

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


class UnreadableOutputError(WriterError):
    """The model answered, but nothing usable could be read from it (after a repair request, or
    cut off before any item was complete). A profile whose reference keeps going may catch it."""


class PromptSet:
    """The texts a profile speaks, by name, with one hash over all of them. `override_dir` may hold
    `<profile>/<name>.txt` files that replace texts of the same name."""

    def __init__(self, profile: str, texts: Mapping[str, str], override_dir: Path | None = None) -> None:
        self.texts: dict[str, str] = dict(texts)
        for name in self.texts:
            if override_dir is not None and (path := override_dir / profile / f"{name}.txt").is_file():
                self.texts[name] = path.read_text(encoding="utf-8")
        canonical = json.dumps(sorted(self.texts.items()), ensure_ascii=False)
        self.hash = hashlib.sha256(canonical.encode()).hexdigest()

    @classmethod
    def from_files(cls, profile: str, names: Sequence[str], override_dir: Path | None = None) -> PromptSet:
        """Texts kept in this repository, `app/writers/prompts/<profile>/<name>.txt`."""
        texts = {name: (PROMPTS_DIR / profile / f"{name}.txt").read_text(encoding="utf-8") for name in names}
        return cls(profile, texts, override_dir)

    def __getitem__(self, name: str) -> str:
        return self.texts[name]

    def render(self, name: str, **values: str) -> str:
        """A template with `$name` placeholders (Memstore's own texts)."""
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
    resends: int = 0  # answers cut off at the budget, asked again with a larger one
    salvaged: int = 0  # answers still cut off, of which the complete items were kept

    async def ask(
        self,
        step: str,
        messages: ChatMessages,
        *,
        parse: Callable[[Any], T],
        max_tokens: int,
        form: Structure = "none",
        schema: dict[str, Any] | None = None,
    ) -> T:
        """The parsed answer to `messages`, sent as they are. `form` is the response_format the
        protocol asks for (the writer's setting may override it); `schema` is what a schema form
        sends. A cut-off answer is asked again once with twice the budget (up to the cap), then its
        complete items are kept; an unreadable one gets one repair request, then `WriterError`."""
        budget = min(max_tokens, self.max_tokens_cap)
        text, finish = await self._call(step, messages, budget, form, schema)
        if finish == "length" and (larger := min(2 * budget, self.max_tokens_cap)) > budget:
            self.resends += 1
            budget = larger
            text, finish = await self._call(f"{step}.resend", messages, budget, form, schema)
        try:
            return parse(parse_json(text))
        except ParseError as first:
            if finish == "length":
                if (kept := salvage_json(text)) is not None:
                    self.salvaged += 1
                    return parse(kept)
                msg = f"{step} output was cut off at the token limit before any item was complete"
                # At temperature 0 the same request is cut off the same way: that attempt is the last.
                limit = 1 if self.transport.deterministic else UNPARSEABLE_ATTEMPTS
                raise UnreadableOutputError(
                    msg, raw_output=self.raw_output(), attempt_limit=limit, usage=self.usage()
                ) from first
            error = first
        self.repairs += 1
        repair = [*messages, {"role": "assistant", "content": text}]
        repair.append({"role": "user", "content": _REPAIR.format(error=error)})
        repaired, finish = await self._call(f"{step}.repair", repair, budget, form, schema)
        try:
            return parse(parse_json(repaired))
        except ParseError as second:
            if finish == "length" and (kept := salvage_json(repaired)) is not None:
                self.salvaged += 1
                return parse(kept)
            limit = UNPARSEABLE_ATTEMPTS
            msg = f"unparseable {step} output after one repair request: {second}"
            if repaired.strip() == text.strip() and self.transport.deterministic:
                limit = 1
                msg += "; the model repeated its answer at temperature 0, so no retry can help"
            raise UnreadableOutputError(
                msg, raw_output=self.raw_output(), attempt_limit=limit, usage=self.usage()
            ) from second

    async def _call(
        self,
        step: str,
        messages: ChatMessages,
        max_tokens: int,
        form: Structure,
        schema: dict[str, Any] | None,
    ) -> tuple[str, str | None]:
        started = time.perf_counter()
        try:
            completion = await self.transport.complete(
                messages,
                max_tokens=max_tokens,
                form=form,
                schema=schema,
                schema_name=step.split(".", maxsplit=1)[0],
            )
        except WriterError as exc:
            self.latency_s += time.perf_counter() - started
            self.transcript.append({"step": step, "error": str(exc), "output": exc.raw_output})
            exc.raw_output = self.raw_output()
            exc.usage = self.usage()
            raise
        self.latency_s += completion.latency_s
        self.prompt_tokens += completion.prompt_tokens or 0
        self.completion_tokens += completion.completion_tokens or 0
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
            "resends": self.resends,
            "salvaged": self.salvaged,
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

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult: ...


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

_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)
# A reasoning model's thoughts before its answer (closed, or cut off with no answer after them).
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)


def answer_text(text: str) -> str:
    """The answer part of what a model wrote: without its `<think>` block and around a code fence."""
    body = _THINK.sub("", text).strip()
    if body.startswith("</think>"):  # a template that opened the block in the prompt
        body = body[len("</think>") :].strip()
    if fenced := _FENCE.search(body):
        return fenced.group(1)
    if body.startswith("```"):  # a fence cut off before it closed
        body = body.split("\n", 1)[1] if "\n" in body else ""
    return body


def parse_json(text: str) -> Any:
    """The JSON value in a model answer (tolerating thoughts, a code fence, or prose around one
    object or array)."""
    body = answer_text(text)
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
    msg = "the answer is not valid JSON" if body.strip() else "the answer is empty"
    raise ParseError(msg)


def salvage_json(text: str) -> Any | None:  # noqa: PLR0912 (one pass of a small JSON scanner)
    """What is complete of a JSON answer cut off part-way: the items of a top-level array, or of the
    arrays of a top-level object, that closed, and the sections of that object that closed; never a
    part of an item. None if nothing is complete."""
    body = answer_text(text)
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if not starts:
        return None
    body = body[min(starts) :]
    stack: list[str] = []
    cut: tuple[int, str] | None = None  # (end of the kept text, the closers it needs)
    in_string = escaped = False
    string_is_key = False
    for index, char in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                if not string_is_key and _item_level(stack):
                    cut = (index + 1, _closers(stack))
            continue
        if char == '"':
            in_string = True
            # In an object a string is a key unless it follows a colon.
            string_is_key = bool(stack) and stack[-1] == "{" and _last_token(body, index) in "{,"
        elif char in "{[":
            stack.append(char)
        elif char in "}]":
            if not stack:
                break
            stack.pop()
            if not stack:
                return _loads(body[: index + 1])
            if _item_level(stack) or stack == ["{"]:  # an item, or a section of the top object
                cut = (index + 1, _closers(stack))
    if cut is None:
        return None
    return _loads(body[: cut[0]] + cut[1])


def _item_level(stack: list[str]) -> bool:
    """Whether a value that closes now is a whole item: of the top array, or of an array of the top object."""
    return stack in (["["], ["{", "["])


def _closers(stack: list[str]) -> str:
    return "".join("]" if c == "[" else "}" for c in reversed(stack))


def _last_token(body: str, index: int) -> str:
    before = body[:index].rstrip()
    return before[-1] if before else ""


def _loads(text: str) -> Any | None:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


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


def clean_tags(value: Any, limit: int = 3, *, lower: bool = True) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    tags = (str(t).strip()[:50] for t in value if t and str(t).strip())
    return tuple(t.lower() if lower else t for t in tags)[:limit]


def clean_owner(value: Any) -> str:
    """`agent` for what the AI assistant owns (Mem0's word for it is `assistant`), else `user`."""
    return "agent" if str(value).strip().lower() in ("agent", "assistant") else "user"
