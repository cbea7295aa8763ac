"""Mem0's classic protocol, as `mem0ai` 1.0.11 speaks it: extract facts, then an event per memory.

*Extract*: Mem0's fact-extraction system prompt (its agent variant when the chunk has an `agent_id`
and an assistant message), and the user message `Input:` followed by `role: content` lines of the
new messages. It answers `{"facts": [...]}` under `response_format: json_object`.

*Update*: for each fact, the five most similar memories of the scope, their union shown under the
ids "0".."n-1" in the order found; one user message built by Mem0's own `get_update_memory_messages`
(the memories and facts as Python lists). The call is made even when the scope holds no related
memory, as Mem0 makes it. It answers `{"memory": [{"id", "text", "event": "ADD|UPDATE|DELETE|NONE",
"old_memory"?}]}`; an item without `text` is skipped, as Mem0 skips it, and recorded as the `no_text`
guard unless it asked for no change (NONE). What differs from Mem0 is listed in docs/writers.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.writers import references
from app.writers.base import CandidateQuery, Message, Op, OpKind, WriteRequest, storable_text
from app.writers.profiles.base import (
    ChatMessages,
    ModelSession,
    ParseError,
    ProfileResult,
    PromptSet,
    expect_list,
    local_id,
    unknown_id_guard,
)

REFERENCE = references.MEM0_CLASSIC
PROMPTS_FILE = "mem0/configs/prompts.py"
# Mem0 writes the date its prompts module was imported into the extraction prompts; Memstore writes
# the chunk's memory date there (a conversation imported today happened when it happened).
TODAY = "datetime.now().strftime('%Y-%m-%d')"
DATE_SLOT = "{" + TODAY + "}"  # where the date goes, written as in the f-string
MAX_TOKENS = 2000  # BaseLlmConfig
UPDATE_CANDIDATES = CandidateQuery(per_text=5)  # vector_store.search(limit=5) per fact, no threshold


@functools.cache
def _texts(root: Path) -> tuple[references.FString, references.FString, str]:
    user = references.fstring(REFERENCE, PROMPTS_FILE, "USER_MEMORY_EXTRACTION_PROMPT", root)
    agent = references.fstring(REFERENCE, PROMPTS_FILE, "AGENT_MEMORY_EXTRACTION_PROMPT", root)
    update = references.constants(REFERENCE, PROMPTS_FILE, "DEFAULT_UPDATE_MEMORY_PROMPT", root=root)
    return user, agent, update["DEFAULT_UPDATE_MEMORY_PROMPT"]


# Schemas, sent only when a writer's response_format asks for one (a small model that needs it): each
# admits everything Mem0's answer may hold (an id the model invents is the `unknown_id` guard's).
_STRING = {"type": "string"}
FACTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"facts": {"type": "array", "items": _STRING}},
    "required": ["facts"],
}
EVENTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "memory": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": _STRING,
                    "text": _STRING,
                    "event": {"type": "string", "enum": ["ADD", "UPDATE", "DELETE", "NONE"]},
                    "old_memory": _STRING,
                },
                "required": ["id", "text", "event"],
            },
        }
    },
    "required": ["memory"],
}


def parse_messages(messages: Sequence[Message]) -> str:
    """The conversation as Mem0 renders it: `role: content` lines of system, user and assistant
    messages, each ending in a newline; names and times are not shown, other roles not at all."""
    return "".join(f"{m.role}: {m.content}\n" for m in messages if m.role in ("system", "user", "assistant"))


def parse_facts(value: Any) -> list[str]:
    """`facts`, strings or `{"fact"|"text": ...}` objects, as Mem0's `normalize_facts` reads them."""
    found = []
    for fact in expect_list(value, "facts"):
        text = (fact.get("fact") or fact.get("text")) if isinstance(fact, dict) else fact
        if text is not None and str(text).strip():
            found.append(str(text).strip())
    return found


def parse_events(value: Any) -> list[dict[str, Any]]:
    items = expect_list(value, "memory")
    if not all(isinstance(item, dict) for item in items):
        msg = 'each "memory" item must be an object'
        raise ParseError(msg)
    return items


class Mem0Profile:
    name = "mem0"
    context_messages = 0  # the protocol shows the model only the new messages

    def __init__(self, prompts_dir: Path | None = None) -> None:
        user, agent, update = _texts(references.references_root())
        self.functions = references.module(REFERENCE, PROMPTS_FILE)
        self.prompts = PromptSet(
            self.name,
            {
                "USER_MEMORY_EXTRACTION_PROMPT": user.render({TODAY: DATE_SLOT}),
                "AGENT_MEMORY_EXTRACTION_PROMPT": agent.render({TODAY: DATE_SLOT}),
                "DEFAULT_UPDATE_MEMORY_PROMPT": update,
            },
            prompts_dir,
        )

    def extract_messages(self, request: WriteRequest) -> ChatMessages:
        agent = request.agent_id is not None and any(m.role == "assistant" for m in request.messages)
        name = "AGENT_MEMORY_EXTRACTION_PROMPT" if agent else "USER_MEMORY_EXTRACTION_PROMPT"
        system = self.prompts[name].replace(DATE_SLOT, request.memory_at.strftime("%Y-%m-%d"))
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Input:\n{parse_messages(request.messages)}"},
        ]

    def update_messages(self, existing: list[dict[str, str]], facts: list[str]) -> ChatMessages:
        text = self.functions.get_update_memory_messages(
            existing, facts, self.prompts["DEFAULT_UPDATE_MEMORY_PROMPT"]
        )
        return [{"role": "user", "content": text}]

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult:
        facts = await model.ask(
            "extract",
            self.extract_messages(request),
            parse=parse_facts,
            max_tokens=MAX_TOKENS,
            form="json_object",
            schema=FACTS_SCHEMA,
        )
        if not facts:
            return ProfileResult([Op(OpKind.NOOP, reason="no facts")])
        candidates = await request.related(facts, UPDATE_CANDIDATES)
        existing = [{"id": str(c.local_id), "text": c.content} for c in candidates]
        events = await model.ask(
            "update",
            self.update_messages(existing, facts),
            parse=parse_events,
            max_tokens=MAX_TOKENS,
            form="json_object",
            schema=EVENTS_SCHEMA,
        )
        return to_ops(events)


def no_text_guard(index: int, event: str) -> dict[str, Any]:
    return {
        "guard": "no_text",
        "op_index": index,
        "op": storable_text(event[:20]),
        "detail": "no text: skipped, as Mem0 skips it",
    }


def to_ops(events: list[dict[str, Any]]) -> ProfileResult:
    result = ProfileResult([])
    for index, item in enumerate(events):
        text = item.get("text") if isinstance(item.get("text"), str) else None
        event = str(item.get("event", "")).upper()
        if not text:
            # Mem0 skips an item without text, whatever its event, and so does the profile; a change
            # asked for and not made is said on the changeset (a NONE asked for none).
            if event != "NONE":
                result.guards.append(no_text_guard(index, event))
            continue
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
