"""Mem0's additive protocol, as `mem0ai` 2.2.1 speaks it: one extraction call that only adds.

The system message is Mem0's additive extraction prompt; the user message is built by Mem0's own
`generate_additive_extraction_prompt`: the scope's last ten earlier messages (`role: content`, each
cut at 300 characters), the ten memories most similar to the new messages (`[{"id": "0", "text"}]`),
the new messages as `role: content` lines, the observation date and the current date. It answers,
under `response_format: json_object`, `{"memory": [{"id", "text", "attributed_to", "linked_memory_ids"?}]}`;
every item with `text` is added (`attributed_to: assistant` as the agent's; one without is skipped, as
Mem0 skips it, and recorded as the `no_text` guard), and a repeat of a memory
is caught by the near-duplicate guard as Mem0 catches it by hash. What differs from Mem0 is listed in
docs/writers.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.writers import references
from app.writers.base import CandidateQuery, Op, OpKind, WriteRequest
from app.writers.profiles.base import (
    ChatMessages,
    ModelSession,
    ProfileResult,
    PromptSet,
    clean_owner,
    expect_list,
)
from app.writers.profiles.mem0 import no_text_guard, parse_messages

REFERENCE = references.MEM0_ADDITIVE
PROMPTS_FILE = "mem0/configs/prompts.py"
MAX_TOKENS = 2000  # BaseLlmConfig
LAST_MESSAGES = 10  # db.get_last_messages(limit=10)
EXISTING = CandidateQuery(per_text=10)  # vector_store.search(top_k=10) over the new messages, no threshold


# Sent only when a writer's response_format asks for a schema (a small model that needs it).
_STRING = {"type": "string"}
MEMORY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "memory": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": _STRING,
                    "text": _STRING,
                    "attributed_to": _STRING,
                    "linked_memory_ids": {"type": "array", "items": _STRING},
                },
                "required": ["text"],
            },
        }
    },
    "required": ["memory"],
}


def parse_memories(value: Any) -> list[Any]:
    return expect_list(value, "memory")


def to_ops(items: list[Any]) -> ProfileResult:
    """An ADD per item with `text`; one without is skipped, as Mem0 skips it, and recorded as a guard."""
    result = ProfileResult([])
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("text"):
            text = str(item["text"]).strip()
            result.ops.append(Op(OpKind.ADD, text, owner=clean_owner(item.get("attributed_to"))))
        else:
            result.guards.append(no_text_guard(index, "ADD"))
    if not result.ops:
        result.ops.append(Op(OpKind.NOOP, reason="nothing new"))
    return result


class Mem0AdditiveProfile:
    name = "mem0-v3"
    context_messages = LAST_MESSAGES

    def __init__(self, prompts_dir: Path | None = None) -> None:
        self.functions = references.module(REFERENCE, PROMPTS_FILE)
        self.prompts = PromptSet(
            self.name, {"ADDITIVE_EXTRACTION_PROMPT": self.functions.ADDITIVE_EXTRACTION_PROMPT}, prompts_dir
        )

    def extract_messages(
        self, request: WriteRequest, existing: list[dict[str, str]], new: str
    ) -> ChatMessages:
        user = self.functions.generate_additive_extraction_prompt(
            existing_memories=existing,
            new_messages=new,
            last_k_messages=[{"role": m.role, "content": m.content} for m in request.context],
            current_date=request.now.date().isoformat(),
            timestamp=request.memory_at.date().isoformat(),
        )
        return [
            {"role": "system", "content": self.prompts["ADDITIVE_EXTRACTION_PROMPT"]},
            {"role": "user", "content": user},
        ]

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult:
        new = parse_messages(request.messages)
        candidates = await request.related([new], EXISTING) if new.strip() else ()
        existing = [{"id": str(c.local_id), "text": c.content} for c in candidates]
        items = await model.ask(
            "extract",
            self.extract_messages(request, existing, new),
            parse=parse_memories,
            max_tokens=MAX_TOKENS,
            form="json_object",
            schema=MEMORY_SCHEMA,
        )
        return to_ops(items)
