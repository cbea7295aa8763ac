"""The MemOS protocol (its MemReader's structured extraction): one call turns the conversation into a
memory list.

The model sees the new messages, with the scope's last few messages to tell who and what is meant,
and answers `{"memory list": [{"key", "memory_type", "value", "tags"}], "summary"}`. Each item is
added with its `value` as content and its tags; its type and title are the version's reason, and the
summary stays in the raw output. Merging is left to Memstore: a memory already known is caught by the
near-duplicate guard at apply, as with the `simple` profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.writers.base import Op, OpKind, WriteRequest
from app.writers.profiles.base import (
    ModelSession,
    ParseError,
    ProfileResult,
    PromptSet,
    clean_tags,
    expect_list,
    format_date,
    format_messages,
)

# UserMemory: about the user (who they are, what they like or plan); LongTermMemory: anything else.
MEMORY_TYPES = ("UserMemory", "LongTermMemory")
_STRING = {"type": "string"}
MEMORY_LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "memory list": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "key": _STRING,
                    "memory_type": {"type": "string", "enum": list(MEMORY_TYPES)},
                    "value": _STRING,
                    "tags": {"type": "array", "items": _STRING},
                },
                "required": ["key", "memory_type", "value", "tags"],
            },
        },
        "summary": _STRING,
    },
    "required": ["memory list", "summary"],
}


@dataclass(frozen=True)
class MemoryItem:
    key: str
    memory_type: str
    value: str
    tags: tuple[str, ...]


def parse_memory_list(value: Any) -> list[MemoryItem]:
    if isinstance(value, dict) and "memory list" not in value and "memory_list" in value:
        value = {"memory list": value["memory_list"]}  # the key written without its space
    found = []
    for item in expect_list(value, "memory list"):
        if not isinstance(item, dict) or not isinstance(item.get("value"), str):
            msg = 'each "memory list" item must be an object with a "value" string'
            raise ParseError(msg)
        if not item["value"].strip():
            continue
        memory_type = item.get("memory_type")
        found.append(
            MemoryItem(
                key=str(item.get("key") or "").strip()[:100],
                # MemOS reads any other type as LongTermMemory
                memory_type=memory_type if memory_type in MEMORY_TYPES else "LongTermMemory",
                value=item["value"].strip(),
                tags=clean_tags(item.get("tags")),
            )
        )
    return found


class MemosProfile:
    name = "memos"
    context_messages = 4  # two turns, as the overlap of MemOS's conversation windows
    extra_body: dict[str, Any] = {}

    def __init__(self, prompts_dir: Path | None = None) -> None:
        self.prompts = PromptSet(self.name, ["extract", "extract_user"], prompts_dir)

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult:
        dates = {"memory_date": format_date(request.memory_at), "current_date": format_date(request.now)}
        items = await model.ask(
            "extract",
            self.prompts.render("extract", **dates),
            self.prompts.render(
                "extract_user",
                context=format_messages(request.context),
                messages=format_messages(request.messages),
            ),
            parse=parse_memory_list,
            schema=MEMORY_LIST_SCHEMA,
            max_tokens=384 + 128 * len(request.messages),
        )
        if not items:
            return ProfileResult([Op(OpKind.NOOP, reason="nothing worth remembering")])
        return ProfileResult([to_op(item) for item in items])


def to_op(item: MemoryItem) -> Op:
    reason = f"{item.memory_type}: {item.key}" if item.key else item.memory_type
    return Op(OpKind.ADD, item.value, tags=item.tags, reason=reason)
