"""A writer that stores what was said, as it was said: one ADD per message, no model, no rules.

It is what Mem0 does with `infer=False` (docs/mem0.md): the Mem0-compatible add posts such a chunk for
this writer, and it goes through the same queue, guards and versions as any other. System messages
are instructions, not statements, and are skipped; an assistant's message is stored as the agent's.
The apply step's guards still hold: a message longer than MEMSTORE_MAX_MEMORY_CHARS, or one repeating
an active memory of the scope (the near-duplicate guard), stores nothing and is recorded as a guard.
"""

from __future__ import annotations

from app.writers.base import Op, OpKind, WriteRequest, WriteResult

VERBATIM = "verbatim"


class VerbatimWriter:
    """A `Writer` whose ops are the chunk's own messages, each added as it stands."""

    def __init__(self, name: str = VERBATIM) -> None:
        self.name = name
        self.model: str | None = None
        self.profile: str | None = None
        self.context_messages: int | None = 0  # nothing of the scope's past is read
        self.initial_candidates = False  # nor any memory: it only adds

    async def write(self, request: WriteRequest) -> WriteResult:
        ops = [
            Op(
                OpKind.ADD,
                message.content.strip(),
                owner="agent" if message.role == "assistant" else "user",
                reason="stored verbatim",
            )
            for message in request.messages
            if message.role != "system" and message.content.strip()
        ]
        return WriteResult(ops=ops)
