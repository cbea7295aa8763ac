"""The offline writer: which user statements become memories, and how they reconcile with candidates."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from app.writers.base import Candidate, Message, Op, OpKind, Writer, WriteRequest, WriteResult
from app.writers.offline import RULES_VERSION, OfflineWriter


def _request(*texts: str, candidates: tuple[str, ...] = (), role: str = "user") -> WriteRequest:
    now = datetime.now(UTC)
    return WriteRequest(
        user_id="u1",
        messages=tuple(Message(role=role, content=text) for text in texts),
        context=(),
        candidates=tuple(Candidate(i, content) for i, content in enumerate(candidates)),
        memory_at=now,
        now=now,
    )


async def _ops(*texts: str, candidates: tuple[str, ...] = ()) -> list[Op]:
    result = await OfflineWriter().write(_request(*texts, candidates=candidates))
    return result.ops


async def _contents(*texts: str) -> list[str | None]:
    return [op.content for op in await _ops(*texts)]


# --- the writer's shape -----------------------------------------------------------------------------


async def test_satisfies_the_writer_protocol_and_records_its_rule_set() -> None:
    writer: Writer = OfflineWriter()
    result = await writer.write(_request("I live in Lyon."))

    assert isinstance(result, WriteResult)
    assert (writer.name, writer.model, writer.profile) == ("offline", None, None)
    assert result.raw_output is None
    assert result.usage == {}
    assert result.prompt_hash == hashlib.sha256(RULES_VERSION.encode()).hexdigest()
    assert OfflineWriter(name="baseline").name == "baseline"


# --- the examples from the brief --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "content", "tags"),
    [
        ("I live in Lyon.", "The user lives in Lyon.", ("location",)),
        ("I'm vegetarian", "The user is vegetarian.", ("diet",)),
        ("I mainly use Python", "The user mainly uses Python.", ("tools",)),
        ("my daughter's name is Ana.", "The user's daughter is named Ana.", ("family",)),
    ],
)
async def test_explicit_statements_become_added_memories(
    text: str, content: str, tags: tuple[str, ...]
) -> None:
    assert await _ops(text) == [
        Op(OpKind.ADD, content=content, tags=tags, owner="user", reason="stated by the user")
    ]


async def test_a_move_supersedes_the_earlier_location() -> None:
    ops = await _ops("I moved to Seattle last month", candidates=("The user lives in Lyon.",))

    assert len(ops) == 1
    assert ops[0].kind is OpKind.SUPERSEDE
    assert ops[0].content == "The user lives in Seattle."
    assert ops[0].targets == (0,)
    assert ops[0].tags == ("location",)
    assert ops[0].reason == "location changed from Lyon to Seattle"


# --- every pattern ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "content"),
    [
        # location
        ("I live in Lyon", "The user lives in Lyon."),
        ("I am living in Portland, Oregon.", "The user lives in Portland, Oregon."),
        ("I'm living in Berlin right now!", "The user lives in Berlin."),
        ("I moved to Seattle.", "The user lives in Seattle."),
        ("I've moved to Lisbon", "The user lives in Lisbon."),
        ("I just relocated to Porto a few weeks ago", "The user lives in Porto."),
        ("I'm based in Washington D.C. these days", "The user lives in Washington D.C."),
        ("Recently I moved to Oslo", "The user lives in Oslo."),
        ("I moved to New York to study", "The user lives in New York."),
        ("I live in Austin now", "The user lives in Austin."),
        ("I live in Rome at the moment", "The user lives in Rome."),
        ("I live in Cairo currently.", "The user lives in Cairo."),
        # origin
        ("I'm from São Paulo", "The user is from São Paulo."),
        ("I am originally from Kenya", "The user is from Kenya."),
        ("I grew up in a small town in Ohio, it was quiet.", "The user is from a small town in Ohio."),
        # name
        ("My name is Priya Patel", "The user's name is Priya Patel."),
        ("Hi! Call me Bob.", "The user's name is Bob."),
        ("You can call me Sam", "The user's name is Sam."),
        # age
        ("I'm 34 years old.", "The user is 34 years old."),
        ("I am 70 years old", "The user is 70 years old."),
        # diet
        ("I'm vegan", "The user is vegan."),
        ("I am a vegetarian.", "The user is vegetarian."),
        ("I'm pescatarian these days", "The user is pescatarian."),
        ("I don't eat meat", "The user is vegetarian."),
        # allergy
        ("I'm allergic to peanuts.", "The user is allergic to peanuts."),
        (
            "I'm allergic to peanuts, shellfish, and dust",
            "The user is allergic to peanuts, shellfish, and dust.",
        ),
        ("I am severely allergic to penicillin", "The user is allergic to penicillin."),
        # job
        ("I work at Google", "The user works at Google."),
        ("I work for the city council", "The user works for the city council."),
        ("I work as a nurse at the local hospital", "The user works as a nurse."),
        ("I'm a carpenter by profession", "The user works as a carpenter."),
        ("My job is a software engineer", "The user works as a software engineer."),
        # tools
        ("I mostly use Rust", "The user mainly uses Rust."),
        ("I primarily use VS Code for work", "The user mainly uses VS Code."),
        ("My main language is Go", "The user mainly uses Go."),
        ("I use Vim every day", "The user uses Vim."),
        ("I use C++ for games", "The user uses C++."),
        # relations
        ("My son's name is Leo", "The user's son is named Leo."),
        ("my wife is called Maria", "The user's wife is named Maria."),
        ("My husband is named Tom", "The user's husband is named Tom."),
        ("my partner's name is Alex", "The user's partner is named Alex."),
        ("My sister is called Jo", "The user's sister is named Jo."),
        ("my brother's name is Ken", "The user's brother is named Ken."),
        ("My mother's name is Rosa", "The user's mother is named Rosa."),
        ("my dad is named Frank", "The user's father is named Frank."),
        ("My older daughter's name is Emma Rose", "The user's older daughter is named Emma Rose."),
        # preferences
        ("I like jazz", "The user likes jazz."),
        ("I love hiking with my dog!", "The user likes hiking with their dog."),
        ("I enjoy baking bread.", "The user likes baking bread."),
        ("I like hiking, reading and cooking", "The user likes hiking, reading and cooking."),
        ("I like hiking, it's fun", "The user likes hiking."),
        ("I really like Thai food a lot", "The user likes Thai food."),
        ("I'm a big fan of pottery - it calms me", "The user likes pottery."),
        ("I don't like cilantro", "The user dislikes cilantro."),
        ("I dislike crowds.", "The user dislikes crowds."),
        ("I hate mornings", "The user dislikes mornings."),
        ("I can't stand traffic", "The user dislikes traffic."),
        ("my favorite book is Dune", "The user's favorite book is Dune."),
        ("My favourite colour is green.", "The user's favorite colour is green."),
    ],
)
async def test_supported_patterns(text: str, content: str) -> None:
    assert await _contents(text) == [content]


@pytest.mark.parametrize(
    ("text", "tags"),
    [
        ("I'm from Chile", ("origin",)),
        ("My name is Ana", ("name",)),
        ("I'm 40 years old", ("age",)),
        ("I'm allergic to cats", ("health",)),
        ("I work at Acme", ("work",)),
        ("I use Emacs", ("tools",)),
        ("My dog's name is Rex", ("pets",)),
        ("my cat is called Miso", ("pets",)),
        ("I love tea", ("preferences",)),
        ("my favorite film is Heat", ("preferences",)),
    ],
)
async def test_tags_name_the_kind_of_fact(text: str, tags: tuple[str, ...]) -> None:
    (op,) = await _ops(text)
    assert op.tags == tags
    assert all(tag == tag.lower() for tag in op.tags)


async def test_clauses_joined_by_and_are_read_separately_when_both_are_first_person() -> None:
    assert await _contents("My name is John and I'm 34 years old. I live in Lyon, and I like beer!") == [
        "The user's name is John.",
        "The user is 34 years old.",
        "The user lives in Lyon.",
        "The user likes beer.",
    ]
    assert await _contents("I like fish and chips") == ["The user likes fish and chips."]


async def test_sentences_split_on_semicolons_and_newlines() -> None:
    assert await _contents("I live in Lyon; I'm vegan\nI hate rain") == [
        "The user lives in Lyon.",
        "The user is vegan.",
        "The user dislikes rain.",
    ]


async def test_curly_apostrophes_and_case_are_tolerated() -> None:
    assert await _contents("I\u2019M FROM Peru") == ["The user is from Peru."]


async def test_overlong_or_empty_values_are_dropped() -> None:
    assert await _ops("I like " + "very long thing " * 10) == []
    assert await _ops("I live in !!!") == []


# --- what it does not extract -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Do I live in Paris?",
        "I live in Paris, what about you?",
        "Am I allergic to peanuts?",
        "If I lived in Paris I would be happy.",
        "if I moved to Paris, I'd learn French",
        "I would like to live in Paris.",
        "I'd love to visit Japan.",
        "I want to move to Berlin.",
        "I wish I lived in Rome.",
        "Maybe I'll move to Oslo.",
        "My friend lives in Berlin.",
        "My sister is from Spain.",
        "My friend's name is Tom.",
        "She said she works at Google.",
        "I love you!",
        "I love that!",
        "I love it when it rains.",
        "I like holding them.",
        "I live in fear of spiders.",
        "I'm from work, sorry.",
        "My wife and I love each other.",
        "I'm 30",
        "call me later",
        "Thanks, that's great.",
        "",
    ],
)
async def test_non_statements_produce_nothing(text: str) -> None:
    assert await _ops(text) == []


async def test_only_user_messages_are_read() -> None:
    for role in ("assistant", "system", "tool"):
        result = await OfflineWriter().write(_request("I live in Lyon. I'm vegan.", role=role))
        assert result.ops == []


async def test_context_messages_are_not_evidence() -> None:
    now = datetime.now(UTC)
    request = WriteRequest(
        user_id="u1",
        messages=(Message("user", "Thanks!"), Message("assistant", "You said you live in Lyon.")),
        context=(Message("user", "I live in Lyon."),),
        candidates=(),
        memory_at=now,
        now=now,
    )
    assert (await OfflineWriter().write(request)).ops == []


# --- reconciliation ---------------------------------------------------------------------------------


async def test_a_known_fact_is_a_noop() -> None:
    ops = await _ops("i live in lyon!", candidates=("The user likes tea.", "The user lives in Lyon"))
    assert ops == [Op(OpKind.NOOP, targets=(1,), reason="already known")]


async def test_a_known_multi_valued_fact_is_a_noop_and_a_new_one_is_added() -> None:
    ops = await _ops("I like tea. I like coffee.", candidates=("The user likes tea.",))
    assert [(op.kind, op.targets, op.content) for op in ops] == [
        (OpKind.NOOP, (0,), None),
        (OpKind.ADD, (), "The user likes coffee."),
    ]


async def test_a_changed_single_valued_fact_supersedes_every_holder_oldest_first() -> None:
    ops = await _ops(
        "I'm pescatarian now",
        candidates=("The user is vegetarian.", "The user lives in Lyon.", "The user is vegan."),
    )
    assert ops == [
        Op(
            OpKind.SUPERSEDE,
            content="The user is pescatarian.",
            targets=(0, 2),
            tags=("diet",),
            reason="diet changed from vegetarian and vegan to pescatarian",
        )
    ]


@pytest.mark.parametrize(
    ("text", "old", "new"),
    [
        ("My name is Sam", "The user's name is Samuel.", "The user's name is Sam."),
        ("I'm 35 years old", "The user is 34 years old.", "The user is 35 years old."),
        ("I work at Globex", "The user works at Initech.", "The user works at Globex."),
        ("I work as a chef", "The user works as a nurse.", "The user works as a chef."),
        ("I mainly use Go", "The user mainly uses Python.", "The user mainly uses Go."),
        ("My dog is called Max", "The user's dog is named Rex.", "The user's dog is named Max."),
        (
            "My favorite book is Emma",
            "The user's favorite book is Dune.",
            "The user's favorite book is Emma.",
        ),
        ("I'm from Peru", "The user is from Chile.", "The user is from Peru."),
    ],
)
async def test_single_valued_slots_are_superseded(text: str, old: str, new: str) -> None:
    (op,) = await _ops(text, candidates=(old,))
    assert (op.kind, op.content, op.targets) == (OpKind.SUPERSEDE, new, (0,))


async def test_different_favorites_and_relations_are_different_slots() -> None:
    ops = await _ops(
        "My favorite film is Heat. My son's name is Leo.",
        candidates=("The user's favorite book is Dune.", "The user's daughter is named Ana."),
    )
    assert [op.kind for op in ops] == [OpKind.ADD, OpKind.ADD]


async def test_a_dislike_supersedes_the_like_and_vice_versa() -> None:
    (op,) = await _ops("I hate TEA", candidates=("The user likes tea.",))
    assert (op.kind, op.content, op.targets) == (OpKind.SUPERSEDE, "The user dislikes TEA.", (0,))

    (op,) = await _ops("I love olives", candidates=("The user dislikes olives.",))
    assert (op.kind, op.content, op.targets) == (OpKind.SUPERSEDE, "The user likes olives.", (0,))


async def test_allergies_and_tools_accumulate() -> None:
    ops = await _ops(
        "I'm allergic to shellfish. I use Docker.",
        candidates=("The user is allergic to peanuts.", "The user uses Git."),
    )
    assert [(op.kind, op.content) for op in ops] == [
        (OpKind.ADD, "The user is allergic to shellfish."),
        (OpKind.ADD, "The user uses Docker."),
    ]


@pytest.mark.parametrize(
    ("text", "candidates", "deleted"),
    [
        ("I no longer live in Lyon.", ("The user likes tea.", "The user lives in Lyon."), 1),
        ("I don't live in lyon anymore", ("The user lives in Lyon.",), 0),
        ("I don't like tea anymore", ("The user likes tea.",), 0),
        ("I no longer like Tea", ("The user likes tea.",), 0),
        ("I stopped liking tea", ("The user likes tea.",), 0),
        ("I'm not vegetarian anymore", ("The user is vegetarian.",), 0),
        ("I'm no longer vegetarian", ("The user is vegan.",), 0),
        ("I'm not allergic to cats anymore", ("The user is allergic to cats.",), 0),
        ("I stopped using Windows", ("The user uses Windows.",), 0),
    ],
)
async def test_retractions_delete_the_matching_memory(
    text: str, candidates: tuple[str, ...], deleted: int
) -> None:
    (op,) = await _ops(text, candidates=candidates)
    assert op.kind is OpKind.DELETE
    assert op.targets == (deleted,)
    assert op.content is None


async def test_a_retraction_without_a_matching_memory_does_nothing() -> None:
    assert await _ops("I no longer live in Paris", candidates=("The user lives in Lyon.",)) == []
    assert await _ops("I don't like tea anymore") == []
    assert await _ops("I'm not vegan anymore", candidates=("The user is vegetarian.",)) == []


async def test_within_a_chunk_the_later_statement_about_a_slot_wins() -> None:
    ops = await _ops(
        "I live in Lyon. I like tea.",
        "Actually I moved to Seattle last month.",
        candidates=("The user lives in Paris.",),
    )
    assert [(op.kind, op.content, op.targets) for op in ops] == [
        (OpKind.ADD, "The user likes tea.", ()),
        (OpKind.SUPERSEDE, "The user lives in Seattle.", (0,)),
    ]
    assert await _contents("I love tea. Actually I hate tea.") == ["The user dislikes tea."]


async def test_a_statement_then_a_retraction_of_another_value_keeps_the_statement() -> None:
    ops = await _ops(
        "I live in Seattle now. I no longer live in Lyon.", candidates=("The user lives in Lyon.",)
    )
    assert [(op.kind, op.content, op.targets) for op in ops] == [
        (OpKind.SUPERSEDE, "The user lives in Seattle.", (0,))
    ]


async def test_a_statement_retracted_later_in_the_chunk_is_dropped() -> None:
    ops = await _ops(
        "I live in Lyon. Well, I don't live in Lyon anymore.", candidates=("The user lives in Lyon.",)
    )
    assert [(op.kind, op.targets) for op in ops] == [(OpKind.DELETE, (0,))]


async def test_no_candidate_is_targeted_twice() -> None:
    ops = await _ops(
        "I live in Lyon. I'm vegan. I like tea. I hate tea. I moved to Nice.",
        candidates=(
            "The user lives in Lyon.",
            "The user lives in Lyon.",
            "The user likes tea.",
            "The user is vegan.",
        ),
    )
    targets = [target for op in ops for target in op.targets]
    assert len(targets) == len(set(targets))
    assert [(op.kind, op.targets) for op in ops] == [
        (OpKind.NOOP, (3,)),
        (OpKind.SUPERSEDE, (2,)),
        (OpKind.SUPERSEDE, (0, 1)),
    ]


async def test_candidates_in_other_phrasings_or_owned_by_the_agent_are_left_alone() -> None:
    now = datetime.now(UTC)
    request = WriteRequest(
        user_id="u1",
        messages=(Message("user", "I live in Seattle."),),
        context=(),
        candidates=(
            Candidate(0, "User resides in Lyon", ("location",)),
            Candidate(1, "The user lives in Lyon.", ("location",), owner="agent"),
        ),
        memory_at=now,
        now=now,
    )
    (op,) = (await OfflineWriter().write(request)).ops
    assert (op.kind, op.targets) == (OpKind.ADD, ())


async def test_same_request_gives_the_same_ops() -> None:
    request = _request(
        "Hi! I'm from Chile and I live in Lyon. I love jazz; my dog's name is Rex. I hate rain.",
        candidates=("The user lives in Paris.", "The user likes jazz."),
    )
    first = await OfflineWriter().write(request)
    for _ in range(3):
        again = await OfflineWriter().write(request)
        assert again.ops == first.ops
        assert again.prompt_hash == first.prompt_hash
    assert [op.kind for op in first.ops] == [
        OpKind.ADD,
        OpKind.SUPERSEDE,
        OpKind.NOOP,
        OpKind.ADD,
        OpKind.ADD,
    ]


async def test_a_chunk_without_user_facts_produces_nothing() -> None:
    result = await OfflineWriter().write(
        _request("Hey, how are you?", "Thanks for the help yesterday!", "Can you summarise this article?")
    )
    assert result.ops == []


# --- time phrases -----------------------------------------------------------------------------------


async def _dated(text: str, said_at: datetime) -> list[tuple[str | None, datetime | None, datetime | None]]:
    request = WriteRequest(
        user_id="u1",
        messages=(Message("user", text, created_at=said_at),),
        context=(),
        candidates=(),
        memory_at=said_at,
        now=said_at,
    )
    return [(op.content, op.valid_from, op.valid_to) for op in (await OfflineWriter().write(request)).ops]


async def test_a_time_phrase_dates_only_the_clause_it_is_in() -> None:
    """The README's own example: the move happened last month; using Python is not dated by it."""
    said_at = datetime(2024, 3, 10, 9, 0, tzinfo=UTC)
    last_month = datetime(2024, 2, 1, tzinfo=UTC)

    assert await _dated("I moved to Seattle last month and I mainly use Python.", said_at) == [
        ("The user lives in Seattle.", last_month, None),
        ("The user mainly uses Python.", None, None),
    ]
    assert await _dated("I mainly use Python, and I moved to Seattle last month.", said_at) == [
        ("The user mainly uses Python.", None, None),
        ("The user lives in Seattle.", last_month, None),
    ]
    # Leading the clause, the phrase is still its own clause's.
    assert await _dated("Last month I moved to Seattle, but my dog's name is Rex.", said_at) == [
        ("The user lives in Seattle.", last_month, None),
        ("The user's dog is named Rex.", None, None),
    ]
    # Each clause keeps its own, not the sentence's first.
    assert await _dated("I've been vegetarian since 2019 and I moved to Seattle in March.", said_at) == [
        ("The user is vegetarian.", datetime(2019, 1, 1, tzinfo=UTC), None),
        ("The user lives in Seattle.", datetime(2024, 3, 1, tzinfo=UTC), None),
    ]


# --- other languages --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "dated", "undated"),
    [
        (
            "Ich bin letzten Monat nach Berlin gezogen und ich benutze hauptsächlich Python.",
            "Der Nutzer wohnt in Berlin.",
            "Der Nutzer benutzt hauptsächlich Python.",
        ),
        (
            "Ich bin letzten Monat nach Berlin gezogen und benutze hauptsächlich Python.",  # no second "ich"
            "Der Nutzer wohnt in Berlin.",
            "Der Nutzer benutzt hauptsächlich Python.",
        ),
        (
            "Me mudé a Madrid el mes pasado y uso principalmente Python.",
            "El usuario vive en Madrid.",
            "El usuario usa principalmente Python.",
        ),
        ("我上个月搬到了北京，我主要用Python。", "用户住在北京。", "用户主要使用Python。"),
        ("我上个月搬到了北京，主要用Python。", "用户住在北京。", "用户主要使用Python。"),
        (
            "先月東京に引っ越しました。そして主にPythonを使っています。",
            "ユーザーは東京に住んでいる。",
            "ユーザーは主にPythonを使っている。",
        ),
        (
            "先月東京に引っ越して、主にPythonを使っています。",
            "ユーザーは東京に住んでいる。",
            "ユーザーは主にPythonを使っている。",
        ),
    ],
)
async def test_in_other_languages_a_time_phrase_dates_only_its_clause(
    text: str, dated: str, undated: str
) -> None:
    said_at = datetime(2024, 3, 10, 9, 0, tzinfo=UTC)
    last_month = datetime(2024, 2, 1, tzinfo=UTC)

    assert await _dated(text, said_at) == [(dated, last_month, None), (undated, None, None)]


@pytest.mark.parametrize(
    ("text", "content", "valid_from", "valid_to"),
    [
        # The phrase leaves the clause before the rules read it, wherever it stands.
        ("Ich wohne seit 2019 in Berlin.", "Der Nutzer wohnt in Berlin.", (2019, 1, 1), None),
        ("Seit drei Jahren wohne ich in Berlin.", "Der Nutzer wohnt in Berlin.", (2021, 3, 10), None),
        ("Ich bin am 3. März 2024 nach Berlin gezogen.", "Der Nutzer wohnt in Berlin.", (2024, 3, 3), None),
        ("Desde hace tres años vivo en Madrid.", "El usuario vive en Madrid.", (2021, 3, 10), None),
        ("我从2019年开始住在北京。", "用户住在北京。", (2019, 1, 1), None),
        ("2019年から東京に住んでいます。", "ユーザーは東京に住んでいる。", (2019, 1, 1), None),
        ("2023年5月に東京に引っ越しました。", "ユーザーは東京に住んでいる。", (2023, 5, 1), None),
        # Each clause keeps its own.
        (
            "Uso principalmente Python y vivo en Madrid desde 2019.",
            "El usuario vive en Madrid.",
            (2019, 1, 1),
            None,
        ),
    ],
)
async def test_in_other_languages_the_fact_is_dated_without_its_phrase(
    text: str, content: str, valid_from: tuple[int, int, int], valid_to: None
) -> None:
    found = await _dated(text, datetime(2024, 3, 10, 9, 0, tzinfo=UTC))

    assert (content, datetime(*valid_from, tzinfo=UTC), valid_to) in found


@pytest.mark.parametrize(
    "text",
    [
        "Ich wohne nicht mehr in Berlin.",
        "Wenn ich in Berlin wohne, fahre ich Rad.",
        "¿Vives en Madrid?",
        "Ya no vivo en Madrid.",
        "我下个月搬到北京。",  # a plan: no 了
        "我不住在北京。",
        "東京に住んでいません。",
        "東京に住んでいましたか？",
        "Ich wohne dort seit 2019.",
    ],
)
async def test_in_other_languages_what_is_not_a_statement_gives_nothing(text: str) -> None:
    assert await _dated(text, datetime(2024, 3, 10, 9, 0, tzinfo=UTC)) == []


async def test_a_place_told_in_another_language_replaces_the_one_held() -> None:
    ops = await _ops("Ich bin nach Berlin gezogen.", candidates=("The user lives in Lyon.",))

    assert [(op.kind, op.content, op.targets, op.reason) for op in ops] == [
        (OpKind.SUPERSEDE, "Der Nutzer wohnt in Berlin.", (0,), "location changed from Lyon to Berlin")
    ]
    # And the other way round, read back from the memory's own language.
    ops = await _ops("I live in Lyon.", candidates=("用户住在北京。",))
    assert [(op.kind, op.reason) for op in ops] == [(OpKind.SUPERSEDE, "location changed from 北京 to Lyon")]
