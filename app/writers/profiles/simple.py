"""The quickstart protocol, Memstore's own: one call for explicit user facts and preferences,
`{"memories": [...]}`, asked for with its JSON schema (small models need it).

No model was trained on it; it is the protocol to run a small general model with. It never changes
existing memories; repeats are caught by the near-duplicate guard at apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.writers.base import Message, Op, OpKind, WriteRequest
from app.writers.profiles.base import ModelSession, ProfileResult, PromptSet, expect_list

MEMORIES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"memories": {"type": "array", "items": {"type": "string"}}},
    "required": ["memories"],
}


def format_messages(messages: Sequence[Message]) -> str:
    """`[YYYY-MM-DD HH:MM] role (name): content` lines."""
    if not messages:
        return "(none)"
    lines = []
    for m in messages:
        when = f"[{m.created_at:%Y-%m-%d %H:%M}] " if m.created_at else ""
        who = f"{m.role} ({m.name})" if m.name else m.role
        lines.append(f"{when}{who}: {m.content}")
    return "\n".join(lines)


def parse_memories(value: Any) -> list[str]:
    return [m.strip() for m in expect_list(value, "memories") if isinstance(m, str) and m.strip()]


class SimpleProfile:
    name = "simple"
    context_messages = 0

    def __init__(self, prompts_dir: Path | None = None) -> None:
        self.prompts = PromptSet.from_files(self.name, ["extract", "extract_user"], prompts_dir)

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult:
        memories = await model.ask(
            "extract",
            [
                {
                    "role": "system",
                    "content": self.prompts.render(
                        "extract", current_date=request.memory_at.strftime("%Y-%m-%d")
                    ),
                },
                {
                    "role": "user",
                    "content": self.prompts.render(
                        "extract_user", messages=format_messages(request.messages)
                    ),
                },
            ],
            parse=parse_memories,
            max_tokens=256 + 64 * len(request.messages),
            form="json_schema",
            schema=MEMORIES_SCHEMA,
        )
        if not memories:
            return ProfileResult([Op(OpKind.NOOP, reason="no facts")])
        return ProfileResult([Op(OpKind.ADD, m) for m in memories])
