"""The Mem0 protocol (classic event format): extract facts, then decide an event per memory.

Existing memories are shown under the ids "0".."n"; the model answers
`{"memory": [{"id", "text", "event": "ADD|UPDATE|DELETE|NONE", "old_memory"?}]}`. The schema of
each call allows only the ids shown for UPDATE, DELETE and NONE, and the next free ones for ADD;
ids a model not held to it invents are ignored (and recorded); ADD ids mean nothing and are not read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.writers.base import Op, OpKind, WriteRequest, storable_text
from app.writers.profiles.base import (
    ModelSession,
    ParseError,
    ProfileResult,
    PromptSet,
    expect_list,
    format_date,
    format_messages,
    local_id,
    unknown_id_guard,
)

FACTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"facts": {"type": "array", "items": {"type": "string"}}},
    "required": ["facts"],
}
_STRING = {"type": "string"}


def events_schema(shown: list[str], new: list[str]) -> dict[str, Any]:
    """The update answer of one call: UPDATE, DELETE and NONE name one of the `shown` ids, ADD one of
    the `new` ids, so that a model held to the schema cannot invent one."""
    return {
        "type": "object",
        "properties": {
            "memory": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {
                                "id": {"type": "string", "enum": new},
                                "text": _STRING,
                                "event": {"type": "string", "enum": ["ADD"]},
                            },
                            "required": ["id", "text", "event"],
                        },
                        {
                            "type": "object",
                            "properties": {
                                "id": {"type": "string", "enum": shown},
                                "text": _STRING,
                                "event": {"type": "string", "enum": ["UPDATE", "DELETE", "NONE"]},
                                "old_memory": _STRING,
                            },
                            "required": ["id", "text", "event"],
                        },
                    ]
                },
            }
        },
        "required": ["memory"],
    }


def parse_facts(value: Any) -> list[str]:
    facts = expect_list(value, "facts")
    return [f.strip() for f in facts if isinstance(f, str) and f.strip()]


def parse_events(value: Any) -> list[dict[str, Any]]:
    items = expect_list(value, "memory")
    if not all(isinstance(item, dict) and "event" in item for item in items):
        msg = 'each "memory" item must be an object with an "event"'
        raise ParseError(msg)
    return items


class Mem0Profile:
    name = "mem0"
    context_messages = 0
    extra_body: dict[str, Any] = {}  # the protocol shows the model only the new messages

    def __init__(self, prompts_dir: Path | None = None) -> None:
        self.prompts = PromptSet(self.name, ["extract", "extract_user", "update", "update_user"], prompts_dir)

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult:
        facts = await model.ask(
            "extract",
            self.prompts.render("extract", current_date=format_date(request.memory_at)),
            self.prompts.render("extract_user", messages=format_messages(request.messages)),
            parse=parse_facts,
            schema=FACTS_SCHEMA,
            max_tokens=512 + 64 * len(request.messages),
        )
        if not facts:
            return ProfileResult([Op(OpKind.NOOP, reason="no facts")])
        candidates = await request.related(facts)
        if not candidates:
            return ProfileResult([Op(OpKind.ADD, fact) for fact in facts])
        existing = [{"id": str(c.local_id), "text": c.content} for c in candidates]
        first_new = max(c.local_id for c in candidates) + 1  # ADD ids mean nothing: the next free ones
        new_ids = [str(first_new + i) for i in range(len(facts))]
        events = await model.ask(
            "update",
            self.prompts.render("update"),
            self.prompts.render(
                "update_user",
                existing_memories=json.dumps(existing, ensure_ascii=False, indent=1),
                new_facts=json.dumps(facts, ensure_ascii=False, indent=1),
            ),
            parse=parse_events,
            schema=events_schema([e["id"] for e in existing], new_ids),
            max_tokens=256 + 128 * (len(facts) + len(candidates)),
        )
        return to_ops(events)


def to_ops(events: list[dict[str, Any]]) -> ProfileResult:
    result = ProfileResult([])
    for index, item in enumerate(events):
        event = str(item.get("event", "")).upper()
        text = item.get("text") if isinstance(item.get("text"), str) else None
        if event == "ADD":
            result.ops.append(Op(OpKind.ADD, text))
        elif event in ("UPDATE", "DELETE"):
            target = local_id(item.get("id"))
            if target is None:
                result.guards.append(unknown_id_guard(index, event, item.get("id")))
                continue
            kind = OpKind.UPDATE if event == "UPDATE" else OpKind.DELETE
            result.ops.append(Op(kind, text if kind is OpKind.UPDATE else None, targets=(target,)))
        elif event != "NONE":
            result.guards.append(
                {
                    "guard": "unknown_op",
                    "op_index": index,
                    "op": storable_text(event[:20]),
                    "detail": "not ADD, UPDATE, DELETE or NONE",
                }
            )
    if not result.ops:
        result.ops.append(Op(OpKind.NOOP, reason="no change"))
    return result
