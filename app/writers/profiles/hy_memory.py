"""The Hy-Memory protocol, as the `hy-memory` framework (2.0.6) speaks it: extract, retrieve, reconcile.

*Extract* is the framework's system prompt and its user prompt: the last ten earlier messages as
`[user]: ...` / `[Name]: ...` lines (what others said cut at 500 characters), the new messages as a
JSON array of `role` / `content` / `name`, the memory date and the current date. It answers, in a
```json fence, `{"memory": [...], "intentions": [...], "basic_info": {...}}`. Chinese input gets the
framework's Chinese prompts, chosen by its own language check.

*Retrieve*: for each extracted memory, the scope's memories at least `RECONCILE_MIN_SCORE` similar,
twenty per memory, twenty in all (the most similar), shown oldest first. With none, every extracted
memory is added and there is no second call, as in the framework.

*Reconcile* is one user message after an empty system message: the framework's prompt with the
current date, `## Existing memories` (`memory_id`, `content`, `owner`, `memory_at` to the minute,
`tags` when there are any) and `## New memories` (each with the chunk's `memory_at`). It answers a
JSON array of ADD / UPDATE / SUPERSEDE (`memory_id`, or `memory_ids` oldest first) and, from older
prompts, DELETE. An answer that cannot be read even after a repair request adds what was extracted,
as the framework does, and says so on the changeset (`reconcile_unreadable`).

`intentions` become memories of their own, not reconciled (the framework stores them apart), their
`valid_until` kept in the version's reason and, read as the framework reads it (a date, or a time
whose day counts, to that day's end, UTC when it names no zone), as the memory's expiry and the end of
its validity: a plan whose day has passed is no longer shown, and `valid_at` after it finds it no
more; `basic_info` fields become one memory each, replacing the field's earlier memory when the value
changed. What differs from the framework is listed in
docs/writers.md; `tests/integration/writers/test_protocol_fidelity.py` holds this module to it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from app.writers import references
from app.writers.base import Candidate, CandidateQuery, Message, Op, OpKind, WriteRequest, storable_text
from app.writers.profiles.base import (
    ChatMessages,
    ModelSession,
    ParseError,
    ProfileResult,
    PromptSet,
    UnreadableOutputError,
    clean_owner,
    clean_tags,
    local_id,
    unknown_id_guard,
)

REFERENCE = references.HY_MEMORY
# What the framework asks for (MEMORY_AGENT_MAX_TOKENS; MemoryReconciler's MAX_TOKENS, PER_OP_TOKENS,
# BASE_OVERHEAD_TOKENS, MAX_TOKENS_UPPER_BOUND).
EXTRACT_MAX_TOKENS = 2000
HISTORY_MESSAGES = 10  # MEMORY_EXTRACT_HISTORY_TURNS (5) turns of two messages
HISTORY_CUT_CHARS = 500  # max_chars_assistant
# Its reconcile candidates (SEARCH_TOPK, FINAL_TOPK * 2, HYBRID_MIN_SCORE): the framework's floor is on
# cosine plus a fifth of a BM25 score; Memstore's is on cosine alone, at the same value.
RECONCILE_CANDIDATES = CandidateQuery(per_text=20, min_score=0.4, total=20)
_KNOWN_ROLES = frozenset(("user", "assistant", "system", "tool"))
_LABELLED = re.compile(r"^\[([^\]\n]{1,32})\]:\s?")
_BARE_ROLE = re.compile(r"^(user|assistant|system|tool):\s?")
BASIC_FIELDS = ("name", "age", "location", "occupation", "employer")  # BasicProfileConfig's default fields
_FIELD_WORDS_ZH = {
    "name": "名字",
    "age": "年龄",
    "location": "所在地",
    "occupation": "职业",
    "employer": "雇主",
}


@dataclass(frozen=True)
class Texts:
    """The framework's texts, by the names it gives them, and its language check."""

    prompts: PromptSet
    is_chinese: Callable[..., bool]


@functools.cache
def _reference_texts(root: Path) -> dict[str, str]:
    get = functools.partial(references.constants, REFERENCE, root=root)
    return {
        **get("hy_memory/agent/extractor.py", "EXTRACT_SYSTEM_PROMPT", "EXTRACT_PROMPT"),
        **get("hy_memory/agent/reconciler.py", "RECONCILE_PROMPT"),
        **get(
            "hy_memory/agent/prompts_zh.py",
            "EXTRACT_SYSTEM_PROMPT_ZH",
            "EXTRACT_PROMPT_ZH",
            "RECONCILE_PROMPT_ZH",
        ),
        **get("hy_memory/pipelines/base.py", "_USER_NAME_LINE_EN", "_USER_NAME_LINE_ZH"),
    }


def load_texts(prompts_dir: Path | None = None, root: Path | None = None) -> Texts:
    root = root or references.references_root()
    lang = references.module(REFERENCE, "hy_memory/utils/lang_detect.py", root)
    return Texts(PromptSet("hy-memory", _reference_texts(root), prompts_dir), lang.is_chinese)


# --- what the model is shown -------------------------------------------------------------------------


def new_messages(messages: Sequence[Message]) -> str:
    """The new messages as the framework hands them to extract: a compact JSON array."""
    return json.dumps(
        [{"role": m.role, "content": m.content, **({"name": m.name} if m.name else {})} for m in messages],
        ensure_ascii=False,
    )


def _label(message: Message) -> str:
    """The speaker as the framework labels a line: `user` (even when named), a named other person by
    name, otherwise the role."""
    if message.role == "user":
        return "user"
    if message.role == "assistant" and message.name:
        return message.name
    return message.role


def last_messages(context: Sequence[Message], texts: Texts) -> str:
    """The earlier messages as the framework renders its history: each stored as `[label]: text`
    lines and read back line by line (a line with no label continues the message before it), the
    last ten kept, what others said cut at 500 characters, after one line naming the user when an
    earlier message of theirs carried a name."""
    parsed: list[tuple[str, str]] = []
    user_name = ""
    for message in context:
        if message.role == "user" and message.name and message.name.strip():
            user_name = message.name.strip()
        for line in f"[{_label(message)}]: {message.content}".split("\n"):
            if match := _LABELLED.match(line) or _BARE_ROLE.match(line):
                parsed.append((match.group(1), line[match.end() :]))
            elif parsed:
                label, said = parsed[-1]
                parsed[-1] = (label, said + "\n" + line)
            else:
                parsed.append(("user", line))
    recent = parsed[-HISTORY_MESSAGES:]
    if not recent:
        return "(none)"
    lines = []
    if user_name:
        chinese = texts.is_chinese("\n".join(body for _, body in recent))
        line = texts.prompts["_USER_NAME_LINE_ZH" if chinese else "_USER_NAME_LINE_EN"]
        lines.append(line.format(name=user_name))
    for label, said in recent:
        text = said.strip()
        if (label == "assistant" or label not in _KNOWN_ROLES) and len(text) > HISTORY_CUT_CHARS:
            text = text[:HISTORY_CUT_CHARS] + "..."
        lines.append(f"[{label}]: {text}")
    return "\n".join(lines)


def extract_messages(request: WriteRequest, texts: Texts) -> ChatMessages:
    content = new_messages(request.messages)
    suffix = "_ZH" if texts.is_chinese(content) else ""
    user = texts.prompts[f"EXTRACT_PROMPT{suffix}"].format(
        content=content,
        current_date=request.now.date().isoformat(),
        memory_at=request.memory_at.strftime("%Y-%m-%d"),
        last_messages=last_messages(request.context, texts),
    )
    return [
        {"role": "system", "content": texts.prompts[f"EXTRACT_SYSTEM_PROMPT{suffix}"]},
        {"role": "user", "content": user},
    ]


def _minute(value: datetime | None) -> str | None:
    return value.strftime("%Y-%m-%d %H:%M") if value is not None else None


def _oldest_first(candidate: Candidate) -> str:
    when = candidate.memory_at or candidate.created_at
    return when.isoformat() if when else ""


def reconcile_messages(
    extracted: Sequence[Extracted], candidates: Sequence[Candidate], request: WriteRequest, texts: Texts
) -> ChatMessages:
    new = [
        {
            "content": m.content,
            "owner": m.owner,
            "memory_at": _minute(request.memory_at),
            "tags": list(m.tags),
        }
        for m in extracted
    ]
    existing = []
    for candidate in sorted(candidates, key=_oldest_first):
        item: dict[str, Any] = {
            "memory_id": str(candidate.local_id),
            "content": candidate.content,
            "owner": candidate.owner or "user",
            "memory_at": _minute(candidate.memory_at),
        }
        if candidate.tags:
            item["tags"] = list(candidate.tags)
        existing.append(item)
    chinese = texts.is_chinese("\n".join(m.content for m in extracted))
    prompt = texts.prompts["RECONCILE_PROMPT_ZH" if chinese else "RECONCILE_PROMPT"].format(
        current_date=_minute(request.now),
        new_memories=json.dumps(new, ensure_ascii=False, indent=2),
        existing_memories=json.dumps(existing, ensure_ascii=False, indent=2),
        few_shot_section="",
    )
    return [{"role": "system", "content": ""}, {"role": "user", "content": prompt}]


def reconcile_max_tokens(new_memories: int) -> int:
    return min(8000, max(2000, 300 * new_memories + 500))


# --- what the model answers ------------------------------------------------------------------------


@dataclass(frozen=True)
class Extracted:
    content: str
    tags: tuple[str, ...]
    owner: str
    valid_until: str | None = None  # intentions only


@dataclass(frozen=True)
class Extraction:
    memories: list[Extracted]
    intentions: list[Extracted]
    basic_info: dict[str, str]


def _items(value: Any, key: str) -> list[Extracted]:
    items = value.get(key) or []
    if not isinstance(items, list):
        msg = f'"{key}" must be a list'
        raise ParseError(msg)
    found = []
    for item in items:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("content"), str)
            or not item["content"].strip()
        ):
            continue  # as the framework: an item without content is skipped
        until = item.get("valid_until")
        found.append(
            Extracted(
                item["content"].strip(),
                clean_tags(item.get("tags"), lower=False),
                clean_owner(item.get("owner")),
                str(until).strip() if until and str(until).strip().lower() not in ("null", "none") else None,
            )
        )
    return found


def expiry_of(valid_until: str | None) -> datetime | None:
    """When an intention valid until `valid_until` expires: the end of that day (the framework pins it
    to 23:59:59 and expires it after), UTC unless it names a zone; None when it is no date."""
    if valid_until is None:
        return None
    try:
        day = datetime.fromisoformat(valid_until)
        day = day if day.tzinfo is not None else day.replace(tzinfo=UTC)
        return day.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    except (ValueError, OverflowError):
        return None


def parse_extract(value: Any) -> Extraction:
    if not isinstance(value, dict):
        msg = 'expected a JSON object with a "memory" list'
        raise ParseError(msg)
    memories = _items(value, "memory") or _items(value, "facts")  # `facts`: the framework's older name
    basic = value.get("basic_info")
    basic = basic if isinstance(basic, dict) else {}
    fields = {
        key: str(raw).strip()[:200]
        for key, raw in basic.items()
        if key in BASIC_FIELDS
        and isinstance(raw, str | int | float)
        and not isinstance(raw, bool)
        and str(raw).strip()
    }
    return Extraction(memories, _items(value, "intentions"), fields)


def parse_reconcile(value: Any) -> list[dict[str, Any]]:
    """The op objects of a reconcile answer: a flat array, or the framework's older groups
    (`[{"reason", "ops": [...]}]`); `[]` is no change. An answer with no op object in it is
    unreadable."""
    entries = value if isinstance(value, list) else [value]
    ops: list[dict[str, Any]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("ops"), list):
            reason = str(entry.get("reason") or "").strip()
            ops.extend(
                {"reason": reason, **op} if reason else op for op in entry["ops"] if isinstance(op, dict)
            )
        elif "op" in entry:
            ops.append(entry)
    if entries and not ops:
        msg = 'expected a JSON array of operations, each an object with an "op"'
        raise ParseError(msg)
    return ops


def to_ops(items: list[dict[str, Any]]) -> ProfileResult:
    result = ProfileResult([])
    for index, item in enumerate(items):
        kind = str(item.get("op", "")).upper()
        content = item.get("content") if isinstance(item.get("content"), str) else None
        common: dict[str, Any] = {
            "tags": clean_tags(item.get("tags"), lower=False),
            "owner": clean_owner(item.get("owner")),
        }
        reason = str(item.get("supersede_reason") or item.get("reason") or "").strip() or None
        if kind == "ADD":
            result.ops.append(Op(OpKind.ADD, content, reason=reason, **common))
        elif kind in ("UPDATE", "DELETE"):
            target = local_id(item.get("memory_id"))
            if target is None:
                result.guards.append(unknown_id_guard(index, kind, item.get("memory_id")))
            elif kind == "UPDATE":
                result.ops.append(Op(OpKind.UPDATE, content, targets=(target,), reason=reason, **common))
            else:  # an older prompt's DELETE: the framework retires the memory
                result.ops.append(Op(OpKind.DELETE, targets=(target,), reason=reason))
        elif kind == "SUPERSEDE":
            raw_ids = item.get("memory_ids")
            raw_ids = raw_ids if isinstance(raw_ids, list) else []
            ids = [str(v).strip() for v in raw_ids if v and str(v).strip()]
            if (single := str(item.get("memory_id") or "").strip()) and single not in ids:
                ids.append(single)  # the framework's single-id form names the newest
            targets = [local_id(v) for v in ids]
            if not targets or None in targets:
                result.guards.append(
                    unknown_id_guard(index, kind, item.get("memory_ids", item.get("memory_id")))
                )
                continue
            result.ops.append(
                Op(
                    OpKind.SUPERSEDE,
                    content,
                    targets=tuple(t for t in targets if t is not None),
                    reason=reason,
                    **common,
                )
            )
        else:
            result.guards.append(
                {
                    "guard": "unknown_op",
                    "op_index": index,
                    "op": storable_text(kind[:20]),
                    "detail": "not ADD, UPDATE, SUPERSEDE or DELETE",
                }
            )
    return result


# Schemas, sent only when a writer's response_format asks for one (a small model that needs it): each
# admits everything the framework's answer may hold. The framework itself sends none.
_STRING = {"type": "string"}
_TAGS = {"type": "array", "items": _STRING}
_OWNER = {"type": "string", "enum": ["user", "agent"]}
_ITEM = {"content": _STRING, "tags": _TAGS, "owner": _OWNER}
EXTRACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "memory": {
            "type": "array",
            "items": {"type": "object", "properties": _ITEM, "required": ["content"]},
        },
        "intentions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {**_ITEM, "valid_until": {"type": ["string", "null"]}},
                "required": ["content"],
            },
        },
        "basic_info": {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
    },
    "required": ["memory"],
}
RECONCILE_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": ["ADD", "UPDATE", "SUPERSEDE", "DELETE"]},
            "memory_id": _STRING,
            "memory_ids": {"type": "array", "items": _STRING},
            **_ITEM,
            "supersede_reason": _STRING,
            "related": {
                "type": "array",
                "items": {"type": "object", "properties": {"memory_id": _STRING, "relation": _STRING}},
            },
        },
        "required": ["op"],
    },
}


class HyMemoryProfile:
    name = "hy-memory"
    context_messages = HISTORY_MESSAGES

    def __init__(self, prompts_dir: Path | None = None) -> None:
        self.texts = load_texts(prompts_dir)
        self.prompts = self.texts.prompts

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult:
        extraction = await model.ask(
            "extract",
            extract_messages(request, self.texts),
            parse=parse_extract,
            max_tokens=EXTRACT_MAX_TOKENS,
            schema=EXTRACT_SCHEMA,
        )
        result = ProfileResult(await self._profile_ops(request, extraction.basic_info))
        if extraction.memories:
            reconciled = await self._reconcile(request, extraction.memories, model)
            result.ops += reconciled.ops
            result.guards += reconciled.guards
        result.ops += [
            Op(
                OpKind.ADD,
                i.content,
                tags=i.tags,
                owner=i.owner,
                reason=f"intention, valid until {i.valid_until}" if i.valid_until else "intention",
                expires_at=(until := expiry_of(i.valid_until)),
                valid_to=until,
            )
            for i in extraction.intentions
        ]
        if not result.ops:
            result.ops.append(Op(OpKind.NOOP, reason="nothing worth remembering"))
        return result

    async def _reconcile(
        self, request: WriteRequest, extracted: list[Extracted], model: ModelSession
    ) -> ProfileResult:
        candidates = await request.related([m.content for m in extracted], RECONCILE_CANDIDATES)
        added = [Op(OpKind.ADD, m.content, tags=m.tags, owner=m.owner) for m in extracted]
        if not candidates:
            return ProfileResult(added)
        try:
            items = await model.ask(
                "reconcile",
                reconcile_messages(extracted, candidates, request, self.texts),
                parse=parse_reconcile,
                max_tokens=reconcile_max_tokens(len(extracted)),
                schema=RECONCILE_SCHEMA,
            )
        except UnreadableOutputError as exc:
            # As the framework: what was extracted is not lost because reconcile could not be read.
            detail = f"reconcile answer unreadable ({exc}); every extracted memory added as it is"
            return ProfileResult(
                added,
                [{"guard": "reconcile_unreadable", "op_index": None, "op": "RECONCILE", "detail": detail}],
            )
        return to_ops(items)

    async def _profile_ops(self, request: WriteRequest, fields: dict[str, str]) -> list[Op]:
        """The user's profile fields (`basic_info`) as memories, one per field: added, or replacing
        the field's memory when its value changed, or nothing when it is known."""
        ops: list[Op] = []
        chinese = any(self.texts.is_chinese(value) for value in fields.values())
        for key, value in fields.items():
            lead = f"用户的{_FIELD_WORDS_ZH[key]}是" if chinese else f"The user's {key} is "
            content = f"{lead}{value}。" if chinese else f"{lead}{value}."
            known = [
                c
                for c in await request.related([content], CandidateQuery(per_text=5))
                if c.content.startswith(lead)
            ]
            if any(c.content == content for c in known):
                continue
            kind, targets = (OpKind.SUPERSEDE, (known[0].local_id,)) if known else (OpKind.ADD, ())
            ops.append(Op(kind, content, targets=targets, tags=("basic_info",), reason=f"basic_info.{key}"))
        return ops
