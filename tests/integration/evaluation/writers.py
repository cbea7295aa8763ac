"""Writers plugged in as an operator's own would be (`MEMSTORE_WRITER_PLUGINS`): two at the ends of
the scale — one that stores nothing, one that stores every turn as it was said — and one that keeps
rewriting a single memory."""

from __future__ import annotations

from app.writers.base import Op, OpKind, WriteRequest, WriteResult

PLUGINS = {
    "nothing": "tests.integration.evaluation.writers:NothingWriter",
    "verbatim": "tests.integration.evaluation.writers:VerbatimWriter",
    "merging": "tests.integration.evaluation.writers:MergingWriter",
}


class NothingWriter:
    model = None
    profile = None
    context_messages: int | None = 0
    initial_candidates = False

    def __init__(self, name: str = "nothing") -> None:
        self.name = name

    async def write(self, request: WriteRequest) -> WriteResult:
        return WriteResult(ops=[Op(OpKind.NOOP, reason="stores nothing")])


class VerbatimWriter:
    """One memory per message, its text as said; reports tokens and latency as a model writer would."""

    model = "verbatim-1"
    profile = None
    context_messages: int | None = 0
    initial_candidates = False

    def __init__(self, name: str = "verbatim") -> None:
        self.name = name

    async def write(self, request: WriteRequest) -> WriteResult:
        said = sum(len(m.content) for m in request.messages)
        return WriteResult(
            ops=[Op(OpKind.ADD, m.content) for m in request.messages],
            usage={"prompt_tokens": said // 4, "completion_tokens": said // 4, "latency_ms": 2.5},
        )


class MergingWriter:
    """Keeps one memory per user and rewrites it with each chunk (UPDATE): its latest version derives
    from the latest chunk only, its earlier versions from the others."""

    model = None
    profile = None
    context_messages: int | None = 0
    initial_candidates = True

    def __init__(self, name: str = "merging") -> None:
        self.name = name

    async def write(self, request: WriteRequest) -> WriteResult:
        said = " ".join(m.content for m in request.messages)
        if not request.candidates:
            return WriteResult(ops=[Op(OpKind.ADD, said)])
        return WriteResult(ops=[Op(OpKind.UPDATE, f"{request.candidates[0].content} {said}", (0,))])
