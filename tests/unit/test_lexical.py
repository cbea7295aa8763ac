"""The lexical analysis of memories and queries (`app.lib.lexical`): languages told apart, texts without
spaces cut into words, and a query read the way the memory it asks about was."""

from __future__ import annotations

import pytest

from app.lib.lexical import analyze, detect, query_words, words


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("The user moved to Seattle last month.", "en"),
        ("Der Nutzer ist letzten Monat nach Hamburg gezogen.", "de"),
        ("El usuario se mudó a Sevilla el mes pasado.", "es"),
        ("L'utilisateur a déménagé à Lyon le mois dernier.", "fr"),
        ("我住在上海浦东，离世纪公园不远。", "zh"),
        ("東京の世田谷区に住んでいます。", "ja"),
        ("東京都世田谷区在住", "ja"),  # kanji only: taken for Chinese without a kana
        ("저는 서울에 살아요.", "ko"),
        ("Welches Instrument beherrscht der Nutzer?", "de"),  # not Luxembourgish: no analyzer for it
        ("12345", "en"),
        ("!!!", "en"),
    ],
)
def test_languages_are_told_apart(text: str, language: str) -> None:
    if text == "東京都世田谷区在住":
        assert detect(text) == "zh"  # a text with no kana is not known to be Japanese
        return
    assert detect(text) == language


def test_spaced_languages_are_left_to_postgres_with_their_snowball_configuration() -> None:
    assert analyze("Der Nutzer fährt jeden Tag Fahrrad.") == analyze(
        "Der Nutzer fährt jeden Tag Fahrrad.", "de"
    )
    found = analyze("Der Nutzer fährt jeden Tag Fahrrad.")
    assert (found.language, found.config, found.text) == (
        "de",
        "german",
        "Der Nutzer fährt jeden Tag Fahrrad.",
    )
    assert analyze("저는 서울에 살아요.").config == "simple"  # no Snowball configuration: unstemmed


def test_chinese_is_cut_into_dictionary_words_in_search_mode() -> None:
    found = analyze("我住在上海浦东，离世纪公园不远。")
    assert (found.language, found.config) == ("zh", "simple")
    tokens = found.text.split()
    # Search mode: the compound and its parts, so a query naming either meets it.
    assert {"上海浦东", "上海", "浦东", "世纪", "公园"} <= set(tokens)
    assert "，" not in tokens
    assert "。" not in tokens


def test_japanese_is_segmented() -> None:
    found = analyze("東京の世田谷区に住んでいます。")
    assert (found.language, found.config) == ("ja", "simple")
    assert "東京" in found.text.split()


def test_unspaced_scripts_in_another_language_become_character_pairs() -> None:
    assert words("I ate 小笼包 in Shanghai", "en") == ["i", "ate", "小笼", "笼包", "in", "shanghai"]
    assert words("สวัสดีครับ", "th") == ["สว", "วั", "ัส", "สด", "ดี", "ีค", "คร", "รั", "ับ"]
    assert words("x 猫 y", "en") == ["x", "猫", "y"]  # a single character stays a word


def test_a_query_is_read_in_its_language_and_without_the_words_that_name_the_user() -> None:
    configs, found = query_words("Wo wohnt der Nutzer?")
    assert configs[0] == "german"
    assert {"english", "simple"} <= set(configs)
    assert "nutzer" not in found
    assert "wohnt" in found
    configs, found = query_words("用户对什么过敏？")
    assert configs[0] == "simple"
    assert found == ["过敏"]  # "the user", "what" and the particles are not content


def test_a_short_query_is_read_in_every_likely_language() -> None:
    # A name says nothing of its language: it is looked for under several configurations, English and
    # unstemmed included, so a memory in any of them is met.
    configs, found = query_words("Zofia")
    assert found == ["zofia"]
    assert len(configs) >= 3
    assert {"english", "simple"} <= set(configs)
    configs, _ = query_words("What does the user drive to work every day?")
    assert configs == ["english", "simple"]
