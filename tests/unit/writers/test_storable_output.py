"""What a model writes is made safe to store before anything is written."""

from __future__ import annotations

import json

from app.writers.base import Op, OpKind, storable_ops
from app.writers.profiles import hy_memory, mem0
from app.writers.profiles.base import ModelSession
from app.writers.transport import ChatTransport, TransportConfig


def _storable_in_postgres(text: str) -> bool:
    text.encode("utf-8")  # raises on a lone surrogate, as asyncpg would
    return "\x00" not in text


def test_nul_and_lone_surrogates_are_taken_out_of_content_tags_and_reason() -> None:
    ops, guards = storable_ops(
        [
            Op(OpKind.ADD, "The user likes tea."),
            Op(OpKind.ADD, "The user lives in\x00 Oslo.\ud800", tags=("ci\x00ty", "\x00"), reason="new\x00"),
            Op(OpKind.SUPERSEDE, "Bergen.", targets=(0,), reason="\udfff\x00"),
        ]
    )
    assert ops[0] == Op(OpKind.ADD, "The user likes tea.")
    assert (ops[1].content, ops[1].tags, ops[1].reason) == ("The user lives in Oslo.", ("city",), "new")
    assert (ops[2].content, ops[2].targets, ops[2].reason) == ("Bergen.", (0,), None)
    for op in ops:
        for text in (op.content or "", op.reason or "", *op.tags):
            assert _storable_in_postgres(text)
    assert [(g["guard"], g["op_index"], g["op"]) for g in guards] == [
        ("unstorable_text", 1, "ADD"),
        ("unstorable_text", 2, "SUPERSEDE"),
    ]


def test_an_op_left_without_content_keeps_its_place_for_the_apply_step_to_drop() -> None:
    ops, guards = storable_ops([Op(OpKind.ADD, "\x00\x00"), Op(OpKind.ADD, "kept")])
    assert [op.content for op in ops] == ["", "kept"]  # index 0 is then `bad_content` at apply
    assert [g["op_index"] for g in guards] == [0]


def test_an_unknown_op_kind_with_a_nul_is_recorded_storably() -> None:
    hy = hy_memory.to_ops([{"op": "ERASE\x00", "content": "x"}])
    events = mem0.to_ops([{"id": "0", "text": "x", "event": "WIPE\x00"}])
    assert [g["op"] for g in hy.guards + events.guards] == ["ERASE", "WIPE"]


def test_the_raw_output_keeps_a_lone_surrogate_as_its_json_escape() -> None:
    transport = ChatTransport(TransportConfig(base_url="http://127.0.0.1:9/v1", model="m"))
    session = ModelSession(transport, max_tokens_cap=100)
    session.transcript.append({"step": "extract", "output": '{"memories": ["a\ud800b\x00"]}'})
    raw = session.raw_output()
    raw.encode("utf-8", "strict")  # what asyncpg does with it
    assert "\x00" not in raw
    assert json.loads(raw)[0]["output"] == '{"memories": ["a\ud800b\x00"]}'
