"""Profiles read model answers strictly enough to be safe and loosely enough to be useful."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import jsonschema_rs
import pytest

from app.config import Settings
from app.writers.base import Message, OpKind
from app.writers.profiles import PROFILES, get_profile, hy_memory, mem0, mem0_v3, memos
from app.writers.profiles.base import ParseError, PromptSet, parse_json, salvage_json
from app.writers.registry import WriterRegistry
from app.writers.transport import RESPONSE_FORMATS

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"memories": []}', {"memories": []}),
        ('```json\n{"facts": ["a"]}\n```', {"facts": ["a"]}),
        ('Here you go:\n```json\n[{"op": "ADD"}]\n```\nDone.', [{"op": "ADD"}]),
        ('Here you go: [{"op": "ADD", "content": "x"}] hope it helps', [{"op": "ADD", "content": "x"}]),
        ('<think>the user said...</think>\n{"facts": ["b"]}', {"facts": ["b"]}),
        ('</think>\n\n{"facts": ["c"]}', {"facts": ["c"]}),
    ],
)
def test_json_is_found_in_what_models_write(text: str, expected: object) -> None:
    assert parse_json(text) == expected


@pytest.mark.parametrize(
    ("text", "message"), [("", "empty"), ("<think>only thoughts", "empty"), ("no", "not valid")]
)
def test_unusable_answers_say_why(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_json(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a reconcile array cut in its third op: the two complete ops, never a part of the third
        (
            '```json\n[{"op": "ADD", "content": "a"}, {"op": "UPDATE", "memory_id": "1", "content": "b"}, '
            '{"op": "SUPERSEDE", "memory_ids": ["2"], "content": "The user mov',
            [{"op": "ADD", "content": "a"}, {"op": "UPDATE", "memory_id": "1", "content": "b"}],
        ),
        # an op cut after its tags: its content is complete, but the op is not
        (
            '[{"op": "ADD", "content": "a"}, {"op": "ADD", "content": "b", "tags": ["x"]',
            [{"op": "ADD", "content": "a"}],
        ),
        # an extraction cut in its intentions: the memories, and the intentions that closed
        (
            '{"memory": [{"content": "m"}], "intentions": [{"content": "i1"}, {"content": "i2", "valid',
            {"memory": [{"content": "m"}], "intentions": [{"content": "i1"}]},
        ),
        ('{"facts": ["one", "two", "thr', {"facts": ["one", "two"]}),
        ('{"memory": [{"content": "The user', None),
        ("not json at all", None),
        ('[{"op": "ADD", "content": "a"}]', [{"op": "ADD", "content": "a"}]),
    ],
)
def test_a_cut_off_answer_keeps_only_its_complete_items(text: str, expected: object) -> None:
    assert salvage_json(text) == expected


def test_hy_memory_reconcile_maps_ops_as_the_framework_reads_them() -> None:
    items = hy_memory.parse_reconcile(
        [
            {
                "op": "ADD",
                "content": "The user has a cat.",
                "owner": "assistant",
                "tags": ["Pets", "x", "y", "z"],
            },
            {"op": "UPDATE", "memory_id": "2", "content": "The user lives in Oslo, Norway."},
            {"op": "SUPERSEDE", "memory_ids": ["0", "1"], "content": "New", "supersede_reason": "moved"},
            {"op": "SUPERSEDE", "memory_id": "3", "content": "Single id", "related": [{"memory_id": "0"}]},
            {"op": "UPDATE", "memory_id": "mem-abc", "content": "invented id"},
            {"op": "DELETE", "memory_id": "4"},  # an older prompt's op: the memory is retired
            {"op": "ERASE", "memory_id": "4"},
            {"reason": "grouped", "ops": [{"op": "ADD", "content": "From a group."}]},
        ]
    )
    result = hy_memory.to_ops(items)
    assert [(op.kind, op.targets) for op in result.ops] == [
        (OpKind.ADD, ()),
        (OpKind.UPDATE, (2,)),
        (OpKind.SUPERSEDE, (0, 1)),
        (OpKind.SUPERSEDE, (3,)),
        (OpKind.DELETE, (4,)),
        (OpKind.ADD, ()),
    ]
    assert result.ops[0].owner == "agent"
    assert result.ops[0].tags == ("Pets", "x", "y")  # proper nouns keep their case, as in the framework
    assert result.ops[2].reason == "moved"
    assert result.ops[5].reason == "grouped"
    assert [g["guard"] for g in result.guards] == ["unknown_id", "unknown_op"]
    assert hy_memory.parse_reconcile([]) == []
    with pytest.raises(ParseError):
        hy_memory.parse_reconcile({"memories": []})


def test_hy_memory_extraction_keeps_intentions_and_profile_fields() -> None:
    extraction = hy_memory.parse_extract(
        {
            "memory": [
                {"content": " The user moved to Lyon. ", "tags": ["Lyon"], "owner": "user"},
                {"content": ""},
            ],
            "intentions": [
                {"content": "The user has a job interview on 2026-12-08.", "valid_until": "2026-12-08"},
                {"content": "The user wants to learn Rust.", "valid_until": None},
            ],
            "basic_info": {"name": "Tim", "location": "Lyon", "hobby": "chess", "age": 34, "employer": ""},
        }
    )
    assert [m.content for m in extraction.memories] == ["The user moved to Lyon."]
    assert [(i.content, i.valid_until) for i in extraction.intentions] == [
        ("The user has a job interview on 2026-12-08.", "2026-12-08"),
        ("The user wants to learn Rust.", None),
    ]
    assert extraction.basic_info == {"name": "Tim", "location": "Lyon", "age": "34"}  # known fields only
    with pytest.raises(ParseError):
        hy_memory.parse_extract([])


def test_hy_memory_schemas_admit_everything_the_framework_may_answer() -> None:
    extract = jsonschema_rs.validator_for(hy_memory.EXTRACT_SCHEMA)
    assert extract.is_valid(
        {
            "memory": [{"content": "a", "tags": ["A"], "owner": "agent"}],
            "intentions": [{"content": "b", "valid_until": None, "owner": "user", "tags": []}],
            "basic_info": {"name": "Tim", "age": 34},
        }
    )
    reconcile = jsonschema_rs.validator_for(hy_memory.RECONCILE_SCHEMA)
    assert reconcile.is_valid(
        [
            {
                "op": "SUPERSEDE",
                "memory_id": "0",
                "content": "x",
                "related": [{"memory_id": "1", "relation": "causes"}],
            },
            {"op": "SUPERSEDE", "memory_ids": ["0", "1"], "content": "y"},
            {"op": "DELETE", "memory_id": "2"},
        ]
    )


def test_mem0_events_map_to_ops_as_mem0_reads_them() -> None:
    result = mem0.to_ops(
        [
            {"id": "0", "text": "a", "event": "NONE"},
            {"id": "1", "text": "b2", "event": "UPDATE", "old_memory": "b"},
            {"id": "2", "text": "c", "event": "DELETE"},
            {"id": "new", "text": "d", "event": "ADD"},
            {"id": "x9", "text": "e", "event": "DELETE"},
            {"id": "3", "text": "", "event": "DELETE"},  # Mem0 skips an item without text
            {"id": "4", "event": "NONE"},  # ... and one asking for no change loses nothing
        ]
    )
    assert [(op.kind, op.targets, op.content) for op in result.ops] == [
        (OpKind.UPDATE, (1,), "b2"),
        (OpKind.DELETE, (2,), None),
        (OpKind.ADD, (), "d"),
    ]
    assert [(g["guard"], g["op_index"], g["op"]) for g in result.guards] == [
        ("unknown_id", 4, "DELETE"),
        ("no_text", 5, "DELETE"),
    ]
    assert mem0.parse_facts({"facts": ["a", {"fact": "b"}, {"text": "c"}, {"other": 1}, " "]}) == [
        "a",
        "b",
        "c",
    ]
    with pytest.raises(ParseError):
        mem0.parse_events({"memory": ["not an object"]})


def test_mem0_additive_items_without_text_are_skipped_and_recorded() -> None:
    result = mem0_v3.to_ops(
        [{"id": "0", "text": "a", "attributed_to": "assistant"}, {"id": "1", "text": ""}, {"id": "2"}, "b"]
    )
    assert [(op.kind, op.content, op.owner) for op in result.ops] == [(OpKind.ADD, "a", "agent")]
    assert [(g["guard"], g["op_index"]) for g in result.guards] == [
        ("no_text", 1),
        ("no_text", 2),
        ("no_text", 3),
    ]
    assert [op.kind for op in mem0_v3.to_ops([{"text": ""}]).ops] == [OpKind.NOOP]


def test_memos_memory_list_maps_to_adds_as_memos_reads_it() -> None:
    items = memos.parse_memory_list(
        {
            "memory list": [
                {
                    "key": "Home",
                    "memory_type": "UserMemory",
                    "value": " The user lives in Lyon. ",
                    "tags": ["Home"],
                },
                {
                    "key": "",
                    "memory_type": "长期记忆",
                    "value": "The user met Ana on 2026-11-01.",
                    "tags": [],
                },
                {"key": "Bad", "memory_type": "Fact", "value": "dropped: no such type", "tags": []},
                {"key": "Bad", "memory_type": "UserMemory", "value": "dropped: tags", "tags": "x"},
                {"key": "Empty", "memory_type": "UserMemory", "value": "  ", "tags": []},
            ],
            "summary": "The user lives in Lyon.",
        }
    )
    assert [(i.value, i.memory_type, i.tags) for i in items] == [
        ("The user lives in Lyon.", "UserMemory", ("Home",)),
        ("The user met Ana on 2026-11-01.", "LongTermMemory", ()),
    ]
    assert [(op.kind, op.reason) for op in map(memos.to_op, items)] == [
        (OpKind.ADD, "UserMemory: Home"),
        (OpKind.ADD, "LongTermMemory"),
    ]
    assert memos.parse_memory_list({"memories": ["x"]}) == []  # no "memory list": nothing, as in MemOS
    with pytest.raises(ParseError, match="memory list"):
        memos.parse_memory_list([])


def test_memos_cuts_a_long_conversation_into_overlapping_windows() -> None:
    when = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    said = [
        Message("user" if i % 2 else "assistant", f"Message {i} " + "word " * 60, created_at=when)
        for i in range(20)
    ]
    windows = memos.windows(said, datetime(2026, 12, 6, tzinfo=UTC))
    assert len(windows) > 1
    for window in windows:
        assert memos.count_tokens(window.text) <= memos.WINDOW_TOKENS
    first, second = windows[0].text.splitlines(), windows[1].text.splitlines()
    carried = [line for line in second if line in first]
    assert carried
    assert second[: len(carried)] == first[-len(carried) :]  # the tail of one window starts the next
    assert memos.count_tokens("\n".join(carried) + "\n") <= memos.OVERLAP_TOKENS
    assert first[0] == f"assistant: [2023-05-08T13:56:00+00:00]: Message 0 {'word ' * 60}"
    # a message without a time takes the scene's first time; a scene without any, now
    [untimed] = memos.windows([Message("user", "hi")], datetime(2026, 12, 6, 9, 5, tzinfo=UTC))
    assert untimed.text == "user: [09:05 AM on 06 December, 2026]: hi\n"


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        ("I moved to Lyon last month.", "en"),
        ("我住在上海浦东。", "zh"),
        ("user: 我喜欢 jazz music a lot", "en"),
    ],
)
def test_memos_language_is_chosen_by_its_own_test(text: str, lang: str) -> None:
    assert memos.detect_lang(text) == lang


def test_every_profile_loads_its_texts() -> None:
    assert {"hy-memory", "mem0", "mem0-v3", "simple", "memos"} <= set(PROFILES)
    for name in PROFILES:
        assert get_profile(name).prompts.texts
    with pytest.raises(ValueError, match="unknown writer profile"):
        get_profile("telepathy")


def test_prompt_overrides_change_the_hash(tmp_path: Path) -> None:
    default = get_profile("simple").prompts
    (tmp_path / "simple").mkdir()
    (tmp_path / "simple" / "extract.txt").write_text('Facts of $current_date, as {"memories": []}')
    custom = PromptSet.from_files("simple", ["extract", "extract_user"], tmp_path)
    assert custom.hash != default.hash
    assert custom.texts["extract_user"] == default.texts["extract_user"]
    assert custom.render("extract", current_date="2026-12-01").startswith("Facts of 2026-12-01")
    # a reference text is replaced the same way, by its name in the reference
    (tmp_path / "memos").mkdir()
    (tmp_path / "memos" / "SIMPLE_STRUCT_MEM_READER_PROMPT.txt").write_text("Mine: ${conversation}")
    memos_profile = memos.MemosProfile(tmp_path)
    assert memos_profile.prompts.hash != get_profile("memos").prompts.hash
    assert (
        memos_profile.messages(memos.Window("user: [t]: hi\n", "hi"))[0]["content"] == "Mine: user: [t]: hi\n"
    )


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
