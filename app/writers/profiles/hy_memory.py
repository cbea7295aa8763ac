"""The Hy-Memory protocol: extract memories, retrieve related ones, reconcile in a second call.

*Extract* sees the new messages, the last few messages for coreference, the memory date and the
current date, and answers `{"memory": [{"content", "tags", "owner"}]}`. *Reconcile* sees those new
memories and the retrieved existing ones (`memory_id, content, owner, memory_at, tags`) and answers
a JSON array of `ADD` / `UPDATE` (lossless merge into one memory) / `SUPERSEDE` (replaces memories
that are no longer true, oldest first); `[]` means no change. With nothing retrieved, every new
memory is added without the second call. The reconcile schema is made for each call: UPDATE and
SUPERSEDE must name ids, from those shown in that call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.writers.base import Op, OpKind, WriteRequest, storable_text
from app.writers.profiles.base import (
    ModelSession,
    ParseError,
    ProfileResult,
    PromptSet,
    candidate_json,
    clean_owner,
    clean_tags,
    expect_list,
    format_date,
    format_messages,
    local_id,
    unknown_id_guard,
)

_STRING = {"type": "string"}
_TAGS = {"type": "array", "items": _STRING, "maxItems": 3}
_OWNER = {"type": "string", "enum": ["user", "agent"]}
EXTRACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "memory": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"content": _STRING, "tags": _TAGS, "owner": _OWNER},
                "required": ["content", "tags", "owner"],
            },
        }
    },
    "required": ["memory"],
}


def reconcile_schema(ids: list[str]) -> dict[str, Any]:
    """The reconcile answer of one call: UPDATE and SUPERSEDE must name ids, and only the `ids` shown
    in that call, so that a model held to the schema cannot invent one."""
    shown = {"type": "string", "enum": ids}
    written = {"content": _STRING}
    labels = {"owner": _OWNER, "tags": _TAGS}
    return {
        "type": "array",
        "items": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"op": {"type": "string", "enum": ["ADD"]}, **written, **labels},
                    "required": ["op", "content"],
                },
                {
                    "type": "object",
                    "properties": {
                        "op": {"type": "string", "enum": ["UPDATE"]},
                        "memory_id": shown,
                        **written,
                        **labels,
                    },
                    "required": ["op", "memory_id", "content"],
                },
                {
                    "type": "object",
                    "properties": {
                        "op": {"type": "string", "enum": ["SUPERSEDE"]},
                        "memory_ids": {"type": "array", "items": shown, "minItems": 1},
                        **written,
                        "supersede_reason": _STRING,
                        **labels,
                    },
                    "required": ["op", "memory_ids", "content"],
                },
            ]
        },
    }


@dataclass(frozen=True)
class Extracted:
    content: str
    tags: tuple[str, ...]
    owner: str


def parse_extract(value: Any) -> list[Extracted]:
    found = []
    for item in expect_list(value, "memory"):
        if not isinstance(item, dict) or not isinstance(item.get("content"), str):
            msg = 'each "memory" item must be an object with a "content" string'
            raise ParseError(msg)
        if item["content"].strip():
            found.append(
                Extracted(
                    item["content"].strip(), clean_tags(item.get("tags")), clean_owner(item.get("owner"))
                )
            )
    return found


def parse_reconcile(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):  # a lone op, or the array wrapped in an object
        wrapped = next((v for v in value.values() if isinstance(v, list)), None)
        value = wrapped if wrapped is not None else [value] if "op" in value else value
    items = expect_list(value, None)
    if not all(isinstance(item, dict) for item in items):
        msg = "each operation must be a JSON object"
        raise ParseError(msg)
    return items


class HyMemoryProfile:
    name = "hy-memory"
    context_messages = 10  # five turns
    # Hy-Memory reasons before answering unless told not to, and the reasoning eats the output budget.
    extra_body: dict[str, Any] = {"chat_template_kwargs": {"reasoning_effort": "no_think"}}

    def __init__(self, prompts_dir: Path | None = None) -> None:
        self.prompts = PromptSet(
            self.name, ["extract", "extract_user", "reconcile", "reconcile_user"], prompts_dir
        )

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult:
        dates = {"memory_date": format_date(request.memory_at), "current_date": format_date(request.now)}
        extracted = await model.ask(
            "extract",
            self.prompts.render("extract", **dates),
            self.prompts.render(
                "extract_user",
                context=format_messages(request.context),
                messages=format_messages(request.messages),
            ),
            parse=parse_extract,
            schema=EXTRACT_SCHEMA,
            max_tokens=512 + 96 * len(request.messages),
        )
        if not extracted:
            return ProfileResult([Op(OpKind.NOOP, reason="nothing worth remembering")])
        candidates = await request.related([m.content for m in extracted])
        if not candidates:
            return ProfileResult([Op(OpKind.ADD, m.content, tags=m.tags, owner=m.owner) for m in extracted])
        items = await model.ask(
            "reconcile",
            self.prompts.render("reconcile", **dates),
            self.prompts.render(
                "reconcile_user",
                new_memories=json.dumps(
                    [{"content": m.content, "owner": m.owner, "tags": list(m.tags)} for m in extracted],
                    ensure_ascii=False,
                    indent=1,
                ),
                existing_memories=json.dumps(
                    [candidate_json(c) for c in candidates], ensure_ascii=False, indent=1
                ),
            ),
            parse=parse_reconcile,
            schema=reconcile_schema([str(c.local_id) for c in candidates]),
            max_tokens=256 + 160 * (len(extracted) + len(candidates)),
        )
        return to_ops(items)


def to_ops(items: list[dict[str, Any]]) -> ProfileResult:
    result = ProfileResult([])
    for index, item in enumerate(items):
        kind = str(item.get("op", "")).upper()
        content = item.get("content") if isinstance(item.get("content"), str) else None
        common = {"tags": clean_tags(item.get("tags")), "owner": clean_owner(item.get("owner"))}
        if kind == "ADD":
            result.ops.append(Op(OpKind.ADD, content, **common))  # type: ignore[arg-type]
        elif kind == "UPDATE":
            target = local_id(item.get("memory_id"))
            if target is None:
                result.guards.append(unknown_id_guard(index, kind, item.get("memory_id")))
                continue
            result.ops.append(Op(OpKind.UPDATE, content, targets=(target,), **common))  # type: ignore[arg-type]
        elif kind == "SUPERSEDE":
            raw_ids = item.get("memory_ids") or ([item["memory_id"]] if "memory_id" in item else [])
            targets = [local_id(v) for v in raw_ids] if isinstance(raw_ids, list) else [None]
            if not targets or any(t is None for t in targets):
                result.guards.append(unknown_id_guard(index, kind, raw_ids))
                continue
            reason = item.get("supersede_reason")
            result.ops.append(
                Op(
                    OpKind.SUPERSEDE,
                    content,
                    targets=tuple(t for t in targets if t is not None),
                    reason=str(reason) if reason else None,
                    **common,  # type: ignore[arg-type]
                )
            )
        else:
            result.guards.append(
                {
                    "guard": "unknown_op",
                    "op_index": index,
                    "op": storable_text(kind[:20]),
                    "detail": "not ADD, UPDATE or SUPERSEDE",
                }
            )
    if not result.ops:
        result.ops.append(Op(OpKind.NOOP, reason="no change"))
    return result
