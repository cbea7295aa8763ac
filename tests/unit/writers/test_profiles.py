"""Profiles read model answers strictly enough to be safe and loosely enough to be useful."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from app.config import Settings
from app.writers.base import OpKind
from app.writers.profiles import PROFILES, get_profile, hy_memory, mem0, memos
from app.writers.profiles.base import ParseError, PromptSet, parse_json
from app.writers.registry import WriterRegistry
from app.writers.transport import RESPONSE_FORMATS

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"memories": []}', {"memories": []}),
        ('```json\n{"facts": ["a"]}\n```', {"facts": ["a"]}),
        ('Here you go: [{"op": "ADD", "content": "x"}] hope it helps', [{"op": "ADD", "content": "x"}]),
    ],
)
def test_json_is_found_in_what_models_write(text: str, expected: object) -> None:
    assert parse_json(text) == expected


@pytest.mark.parametrize(
    ("text", "truncated", "message"), [("", False, "empty"), ('{"memo', True, "cut off")]
)
def test_unusable_answers_say_why(text: str, truncated: bool, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_json(text, truncated=truncated)


def test_hy_memory_reconcile_maps_ops_and_reports_what_it_drops() -> None:
    result = hy_memory.to_ops(
        [
            {
                "op": "ADD",
                "content": "The user has a cat.",
                "owner": "agent",
                "tags": ["Pets", "x", "y", "z"],
            },
            {"op": "UPDATE", "memory_id": "2", "content": "The user lives in Oslo, Norway."},
            {"op": "SUPERSEDE", "memory_ids": ["0", "1"], "content": "New", "supersede_reason": "moved"},
            {"op": "UPDATE", "memory_id": "mem-abc", "content": "invented id"},
            {"op": "DELETE", "memory_id": "3"},  # not part of this protocol
        ]
    )
    assert [(op.kind, op.targets) for op in result.ops] == [
        (OpKind.ADD, ()),
        (OpKind.UPDATE, (2,)),
        (OpKind.SUPERSEDE, (0, 1)),
    ]
    assert result.ops[0].owner == "agent"
    assert result.ops[0].tags == ("pets", "x", "y")
    assert result.ops[2].reason == "moved"
    assert [g["guard"] for g in result.guards] == ["unknown_id", "unknown_op"]
    assert hy_memory.to_ops([]).ops[0].kind is OpKind.NOOP


@pytest.mark.parametrize(
    ("item", "valid"),
    [
        ({"op": "ADD", "content": "The user has a cat."}, True),
        ({"op": "UPDATE", "memory_id": "1", "content": "The user lives in Oslo, Norway."}, True),
        ({"op": "SUPERSEDE", "memory_ids": ["0", "1"], "content": "New", "supersede_reason": "moved"}, True),
        ({"op": "UPDATE", "content": "no id"}, False),
        ({"op": "UPDATE", "memory_id": "7", "content": "an id that was not shown"}, False),
        ({"op": "SUPERSEDE", "content": "no ids"}, False),
        ({"op": "SUPERSEDE", "memory_ids": [], "content": "no ids"}, False),
        ({"op": "SUPERSEDE", "memory_ids": ["0", "mem-9"], "content": "an invented id"}, False),
        ({"op": "DELETE", "memory_id": "0", "content": "not part of this protocol"}, False),
    ],
)
def test_the_reconcile_schema_requires_ids_and_only_those_shown(item: dict[str, Any], valid: bool) -> None:
    schema = hy_memory.reconcile_schema(["0", "1"])
    assert jsonschema_rs.validator_for(schema).is_valid([item]) is valid


@pytest.mark.parametrize(
    ("item", "valid"),
    [
        ({"id": "0", "text": "a", "event": "NONE"}, True),
        ({"id": "1", "text": "b2", "event": "UPDATE", "old_memory": "b"}, True),
        ({"id": "2", "text": "c", "event": "ADD"}, True),
        ({"id": "3", "text": "d", "event": "ADD"}, True),
        ({"id": "7", "text": "e", "event": "DELETE"}, False),
        ({"id": "2", "text": "f", "event": "DELETE"}, False),  # a new id for an existing memory
        ({"id": "0", "text": "g", "event": "ADD"}, False),  # an existing id for a new one
        ({"text": "h", "event": "UPDATE"}, False),
    ],
)
def test_the_mem0_update_schema_allows_only_shown_ids_and_new_ones_for_add(
    item: dict[str, Any], valid: bool
) -> None:
    schema = mem0.events_schema(["0", "1"], ["2", "3"])
    assert jsonschema_rs.validator_for(schema).is_valid({"memory": [item]}) is valid


def test_mem0_events_map_to_ops() -> None:
    result = mem0.to_ops(
        [
            {"id": "0", "text": "a", "event": "NONE"},
            {"id": "1", "text": "b2", "event": "UPDATE", "old_memory": "b"},
            {"id": "2", "text": "c", "event": "DELETE"},
            {"id": "new", "text": "d", "event": "ADD"},
            {"id": "x9", "text": "e", "event": "DELETE"},
        ]
    )
    assert [(op.kind, op.targets, op.content) for op in result.ops] == [
        (OpKind.UPDATE, (1,), "b2"),
        (OpKind.DELETE, (2,), None),
        (OpKind.ADD, (), "d"),
    ]
    assert [g["guard"] for g in result.guards] == ["unknown_id"]
    with pytest.raises(ParseError):
        mem0.parse_events({"memory": [{"id": "0"}]})


def test_memos_memory_list_maps_to_adds() -> None:
    items = memos.parse_memory_list(
        {
            "memory list": [
                {
                    "key": "Home",
                    "memory_type": "UserMemory",
                    "value": " The user lives in Lyon. ",
                    "tags": ["Home"],
                },
                {"key": "", "memory_type": "Fact", "value": "The user met Ana on 2026-11-01.", "tags": "x"},
                {"key": "Empty", "memory_type": "UserMemory", "value": "  ", "tags": []},
            ],
            "summary": "The user lives in Lyon.",
        }
    )
    assert [(i.value, i.memory_type, i.tags) for i in items] == [
        ("The user lives in Lyon.", "UserMemory", ("home",)),
        ("The user met Ana on 2026-11-01.", "LongTermMemory", ()),  # any other type, as MemOS reads it
    ]
    assert [(op.kind, op.reason) for op in map(memos.to_op, items)] == [
        (OpKind.ADD, "UserMemory: Home"),
        (OpKind.ADD, "LongTermMemory"),
    ]
    # the key written without its space is read too; anything else is unparseable
    assert memos.parse_memory_list({"memory_list": []}) == []
    with pytest.raises(ParseError, match="memory list"):
        memos.parse_memory_list({"memories": ["The user lives in Lyon."]})
    with pytest.raises(ParseError, match="value"):
        memos.parse_memory_list({"memory list": [{"key": "Home", "text": "Lyon"}]})


def test_every_profile_loads_its_prompts() -> None:
    assert {"hy-memory", "mem0", "simple", "memos"} <= set(PROFILES)
    for name in PROFILES:
        assert get_profile(name).prompts.texts


def test_prompt_overrides_change_the_hash(tmp_path: Path) -> None:
    default = get_profile("simple").prompts
    (tmp_path / "simple").mkdir()
    (tmp_path / "simple" / "extract.txt").write_text('Facts of $current_date, as {"memories": []}')
    custom = PromptSet("simple", ["extract", "extract_user"], tmp_path)
    assert custom.hash != default.hash
    assert custom.texts["extract_user"] == default.texts["extract_user"]
    assert custom.render("extract", current_date="2026-12-01").startswith("Facts of 2026-12-01")
    with pytest.raises(ValueError, match="unknown writer profile"):
        get_profile("telepathy")


def test_the_example_writers_file_is_valid() -> None:
    registry = WriterRegistry(Settings(writers_file=ROOT / "deploy" / "vllm" / "writers.example.toml"))
    assert {"hy-vllm", "hy-gguf", "hy-mem0", "rules"} <= set(registry.names())
    hy = registry.get("hy-vllm")
    assert (hy.profile, hy.model) == ("hy-memory", "hy-memory")
    assert registry.get("rules").name == "rules"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[writers.a]\nprofile = "hy-memory"\nbase_url = "http://x/v1"\ntemprature = 0\n', "temprature"),
        ('[writers.a]\nprofile = "psychic"\n', "unknown writer profile"),
        ('[writers.a]\nkind = "magic"\n', "kind must be"),
        ('[writers.a]\nprofile = "simple"\nresponse_format = "json"\n', "response_format must be one of"),
        ("[writers.a\n", "cannot read"),
    ],
)
def test_mistakes_in_the_writers_file_fail_start_up_by_name(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "writers.toml"
    path.write_text(body)
    with pytest.raises(ValueError, match=message):
        WriterRegistry(Settings(writers_file=path))


def test_every_response_format_is_a_setting_value() -> None:
    for form in RESPONSE_FORMATS:
        assert Settings(writer_response_format=form).writer_response_format == form
