"""The quickstart protocol: one call for explicit user facts and preferences, `{"memories": [...]}`.

It never changes existing memories; repeats are caught by the near-duplicate guard at apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.writers.base import Op, OpKind, WriteRequest
from app.writers.profiles.base import (
    ModelSession,
    ProfileResult,
    PromptSet,
    expect_list,
    format_date,
    format_messages,
)

MEMORIES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"memories": {"type": "array", "items": {"type": "string"}}},
    "required": ["memories"],
}


def parse_memories(value: Any) -> list[str]:
    return [m.strip() for m in expect_list(value, "memories") if isinstance(m, str) and m.strip()]


class SimpleProfile:
    name = "simple"
    context_messages = 0
    extra_body: dict[str, Any] = {}

    def __init__(self, prompts_dir: Path | None = None) -> None:
        self.prompts = PromptSet(self.name, ["extract", "extract_user"], prompts_dir)

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult:
        memories = await model.ask(
            "extract",
            self.prompts.render("extract", current_date=format_date(request.memory_at)),
            self.prompts.render("extract_user", messages=format_messages(request.messages)),
            parse=parse_memories,
            schema=MEMORIES_SCHEMA,
            max_tokens=256 + 64 * len(request.messages),
        )
        if not memories:
            return ProfileResult([Op(OpKind.NOOP, reason="no facts")])
        return ProfileResult([Op(OpKind.ADD, m) for m in memories])
