"""Time expressions in German, Spanish, Chinese and Japanese: which phrases resolve, to which local day /
week / month / year, and which are left alone; and that each language's table fails when its words or
the calendar are broken.

Every case is said on Wednesday 12 June 2024 at 15:00 in a zone of its language. The expected dates
are worked out from the calendar: that week's Monday is 10 June (last week's the 3rd, next week's the
17th); a month alone not yet begun this year (July) is last year's; a day without a year not yet come
(20 June) is last year's; "N months ago" is the same date N months back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.lib import time_expressions
from app.lib.time_expressions import named_time, resolve
from app.lib.time_words import CHINESE, GERMAN, JAPANESE, SPANISH, TimeWords

ZONES = {
    "de": ZoneInfo("Europe/Berlin"),
    "es": ZoneInfo("Europe/Madrid"),
    "zh": ZoneInfo("Asia/Shanghai"),
    "ja": ZoneInfo("Asia/Tokyo"),
}
SAID = (2024, 6, 12, 15, 0)  # a Wednesday

Case = tuple[str, str | None, str | None]  # text, valid_from, valid_to (local dates; None: not set)

# --- German -----------------------------------------------------------------------------------------

GERMAN_CASES: list[Case] = [
    # Dates, months, years.
    ("Ich bin am 3. März 2024 nach Berlin gezogen", "2024-03-03", None),
    ("Umzug am 03.03.2024", "2024-03-03", None),
    ("Ich bin am 29. Februar 2024 umgezogen", "2024-02-29", None),
    ("Ich bin am 3. März umgezogen", "2024-03-03", None),
    ("Ich bin am 20. Juni umgezogen", "2023-06-20", None),  # not yet come this year
    ("Ich bin im März 2023 umgezogen", "2023-03-01", None),
    ("Ich bin im März umgezogen", "2024-03-01", None),
    ("Ich bin im Juli umgezogen", "2023-07-01", None),  # July has not begun yet
    ("Ich bin im Jahr 2019 umgezogen", "2019-01-01", None),
    # Yesterday, today, tomorrow ("morgen", or "Morgen" where the sentence starts).
    ("Ich habe gestern eine Katze bekommen", "2024-06-11", None),
    ("Ich habe heute gekündigt", "2024-06-12", None),
    ("Ich fliege morgen nach Rom", "2024-06-13", None),
    ("Morgen fliege ich nach Rom", "2024-06-13", None),
    ("Vorgestern war ich in Rom", "2024-06-10", None),
    ("Übermorgen ziehe ich um", "2024-06-14", None),
    # Last / this / next week, month, year.
    ("Ich habe letzte Woche angefangen", "2024-06-03", None),
    ("Diese Woche habe ich angefangen", "2024-06-10", None),
    ("Nächste Woche fange ich an", "2024-06-17", None),
    ("vorletzte Woche", "2024-05-27", None),
    ("Ich bin letzten Monat nach Berlin gezogen", "2024-05-01", None),
    ("Nächsten Monat ziehe ich um", "2024-07-01", None),
    ("Letztes Jahr bin ich umgezogen", "2023-01-01", None),
    ("Nächstes Jahr ziehe ich um", "2025-01-01", None),
    # N ... ago.
    ("Ich habe vor 3 Tagen eine Katze bekommen", "2024-06-09", None),
    ("vor zwei Wochen", "2024-05-29", None),
    ("vor einem Monat", "2024-05-12", None),
    ("vor zehn Tagen", "2024-06-02", None),
    ("vor zwei Jahren", "2022-06-12", None),
    # Since, until, ranges, during.
    ("Ich wohne seit 2019 in Berlin", "2019-01-01", None),
    ("Ich wohne seit drei Jahren in Berlin", "2021-06-12", None),
    ("Ich bin seit letztem Jahr Vegetarier", "2023-01-01", None),
    ("Ich wohne ab nächster Woche in Köln", "2024-06-17", None),
    ("Ich habe bis 2020 in Köln gewohnt", None, "2021-01-01"),
    ("Ich war bis März in Köln", None, "2024-04-01"),
    ("Ich war bis gestern krank", None, "2024-06-12"),
    ("Ich habe von 2019 bis 2021 in Köln gewohnt", "2019-01-01", "2022-01-01"),
    ("zwischen März und Mai", "2024-03-01", "2024-06-01"),
    ("während des letzten Jahres", "2023-01-01", "2024-01-01"),
]
GERMAN_NOT_READ = [
    "Guten Morgen!",
    "Am Morgen trinke ich Kaffee",  # the morning
    "Ich laufe jeden Morgen",
    "Ich bin vor ein paar Tagen umgezogen",  # vague
    "Ich bin vor kurzem umgezogen",
    "Da ich Python mag, benutze ich es",  # "da": because
    "Heutzutage benutze ich Python",
    "Mai ist mein Lieblingsmonat",  # a month alone needs "im", "seit", "bis" ...
    "Ich habe 2019 Fotos",  # a bare number is not a year
    "Ich stehe vor dem Haus",
    "Ich bin 34 Jahre alt",
    "Ich bin am 30. Februar 2023 umgezogen",  # no such day
    "Ich habe von 2021 bis 2019 dort gewohnt",  # backwards
    "In zwei Wochen ziehe ich um",
]

# --- Spanish ----------------------------------------------------------------------------------------

SPANISH_CASES: list[Case] = [
    ("Me mudé a Madrid el 3 de marzo de 2024", "2024-03-03", None),
    ("Me mudé el 3 de marzo del 2024", "2024-03-03", None),
    ("Me mudé el 15/3/2024", "2024-03-15", None),  # day first
    ("Me mudé el 3 de marzo", "2024-03-03", None),
    ("Me mudé el 20 de junio", "2023-06-20", None),
    ("Me mudé en marzo de 2023", "2023-03-01", None),
    ("Me mudé en marzo", "2024-03-01", None),
    ("Me mudé en julio", "2023-07-01", None),
    ("Me mudé en 2019", "2019-01-01", None),
    ("Me mudé en el año 2019", "2019-01-01", None),
    ("Ayer adopté un gato", "2024-06-11", None),
    ("Hoy empecé a correr", "2024-06-12", None),
    ("Mañana vuelo a Roma", "2024-06-13", None),
    ("Mañana por la mañana vuelo a Roma", "2024-06-13", None),  # tomorrow; then the morning
    ("Anteayer adopté un gato", "2024-06-10", None),
    ("Pasado mañana vuelo a Roma", "2024-06-14", None),
    ("Empecé la semana pasada", "2024-06-03", None),
    ("Empecé esta semana", "2024-06-10", None),
    ("Empiezo la próxima semana", "2024-06-17", None),
    ("Empiezo la semana que viene", "2024-06-17", None),
    ("Me mudé el mes pasado", "2024-05-01", None),
    ("Me mudo el proximo mes", "2024-07-01", None),  # typed without its accent
    ("Me mudé el año pasado", "2023-01-01", None),
    ("Me mudo el próximo año", "2025-01-01", None),
    ("Adopté un gato hace 3 días", "2024-06-09", None),
    ("Adopté un gato hace dos semanas", "2024-05-29", None),
    ("Adopté un gato hace un mes", "2024-05-12", None),
    ("Adopté un gato hace diez días", "2024-06-02", None),
    ("Me mudé hace dos años", "2022-06-12", None),
    ("Vivo en Madrid desde 2019", "2019-01-01", None),
    ("Vivo en Madrid desde hace tres años", "2021-06-12", None),
    ("Soy vegetariano desde el año pasado", "2023-01-01", None),
    ("Viví en Sevilla hasta 2020", None, "2021-01-01"),
    ("Estuve en Sevilla hasta marzo", None, "2024-04-01"),
    ("Viví en Sevilla de 2019 a 2021", "2019-01-01", "2022-01-01"),
    ("Estuve en Sevilla entre marzo y mayo", "2024-03-01", "2024-06-01"),
    ("Fui vegetariano durante 2019", "2019-01-01", "2020-01-01"),
]
SPANISH_NOT_READ = [
    "Corro por la mañana",  # the morning
    "Esta mañana desayuné tarde",
    "Corro cada mañana",
    "Hoy en día uso Python",  # nowadays
    "Hoy día todos usan el móvil",
    "Uso Python ya que es fácil",  # "ya que": because
    "Me mudé hace unos días",  # vague
    "Hace frío en Madrid",
    "Me mudé hace mucho tiempo",
    "Me encanta mayo",  # a month alone needs "en", "desde", "hasta" ...
    "Julio es mi mejor amigo",
    "Tengo 2019 fotos",
    "Me mudé el 30 de febrero de 2023",
    "Viví allí de 2021 a 2019",
    "En dos semanas me mudo",
]

# --- Chinese ----------------------------------------------------------------------------------------

CHINESE_CASES: list[Case] = [
    ("我2024年3月3日搬到了北京", "2024-03-03", None),
    ("我2024年3月3号搬到了北京", "2024-03-03", None),
    ("我二〇二四年三月三日搬到了北京", "2024-03-03", None),
    ("我3月3日搬到了北京", "2024-03-03", None),
    ("我6月20日搬到了北京", "2023-06-20", None),
    ("我2023年3月搬到了北京", "2023-03-01", None),
    ("我三月搬到了北京", "2024-03-01", None),
    ("我7月搬到了北京", "2023-07-01", None),
    ("我在2019年搬到了北京", "2019-01-01", None),
    ("我昨天养了一只猫", "2024-06-11", None),
    ("我今天前往上海", "2024-06-12", None),
    ("我明天去上海", "2024-06-13", None),
    ("我前天养了一只猫", "2024-06-10", None),
    ("我后天去上海", "2024-06-14", None),
    ("我上周开始跑步", "2024-06-03", None),
    ("我上个星期开始跑步", "2024-06-03", None),
    ("我这周开始跑步", "2024-06-10", None),
    ("我下周开始新工作", "2024-06-17", None),
    ("我上个月搬到了北京", "2024-05-01", None),
    ("我上個月搬到了北京", "2024-05-01", None),  # traditional characters
    ("我这个月搬到了北京", "2024-06-01", None),
    ("我下个月搬家", "2024-07-01", None),
    ("我去年搬到了北京", "2023-01-01", None),
    ("我今年搬到了北京", "2024-01-01", None),
    ("我明年搬家", "2025-01-01", None),
    ("我3天前养了一只猫", "2024-06-09", None),
    ("我两周前养了一只猫", "2024-05-29", None),
    ("我兩週前養了一隻貓", "2024-05-29", None),
    ("我三个月前搬到了北京", "2024-03-12", None),
    ("我十天前养了一只猫", "2024-06-02", None),
    ("我两年前搬到了北京", "2022-06-12", None),
    ("自从2019年我住在北京", "2019-01-01", None),
    ("从去年开始我吃素", "2023-01-01", None),
    ("2019年以来我住在北京", "2019-01-01", None),
    ("我直到2020年都住在上海", None, "2021-01-01"),
    ("到3月为止我住在上海", None, "2024-04-01"),
    ("我从2019年到2021年住在上海", "2019-01-01", "2022-01-01"),
]
CHINESE_NOT_READ = [
    "以前我住在上海",  # formerly, no number
    "我以前是素食者",
    "2019年以前我住在上海",  # before 2019
    "明日香是我的朋友",  # a name
    "我不想失去年轻的感觉",  # 去年 inside 失去 + 年轻
    "如今年轻人都用手机",  # 今年 inside 如今 + 年轻
    "以前天气很好",  # 前天 inside 以前 + 天气
    "上周末我去了北京",  # last weekend, not last week
    "我几天前搬家了",  # vague
    "我学了三个月中文",  # a duration, not a time
    "我在上海住了三年",
    "1990年代的音乐",  # a decade
    "我有2019张照片",
]

# --- Japanese ---------------------------------------------------------------------------------------

JAPANESE_CASES: list[Case] = [
    ("2024年3月3日に引っ越しました", "2024-03-03", None),
    ("２０２４年３月３日に引っ越しました", "2024-03-03", None),  # full-width digits
    ("3月3日に引っ越しました", "2024-03-03", None),
    ("6月20日に引っ越しました", "2023-06-20", None),
    ("2023年3月に引っ越しました", "2023-03-01", None),
    ("3月に引っ越しました", "2024-03-01", None),
    ("三月に引っ越しました", "2024-03-01", None),
    ("7月に引っ越しました", "2023-07-01", None),
    ("2019年に引っ越しました", "2019-01-01", None),
    ("昨日猫を飼いました", "2024-06-11", None),
    ("今日は仕事を辞めました", "2024-06-12", None),
    ("明日ローマに行きます", "2024-06-13", None),
    ("一昨日猫を飼いました", "2024-06-10", None),
    ("明後日ローマに行きます", "2024-06-14", None),
    ("先週ジョギングを始めました", "2024-06-03", None),
    ("今週ジョギングを始めました", "2024-06-10", None),
    ("来週新しい仕事を始めます", "2024-06-17", None),
    ("先月東京に引っ越しました", "2024-05-01", None),
    ("今月東京に引っ越しました", "2024-06-01", None),
    ("来月引っ越します", "2024-07-01", None),
    ("去年東京に引っ越しました", "2023-01-01", None),
    ("昨年東京に引っ越しました", "2023-01-01", None),
    ("今年東京に引っ越しました", "2024-01-01", None),
    ("来年引っ越します", "2025-01-01", None),
    ("3日前に猫を飼いました", "2024-06-09", None),
    ("2週間前に猫を飼いました", "2024-05-29", None),
    ("3ヶ月前に引っ越しました", "2024-03-12", None),
    ("3か月前に引っ越しました", "2024-03-12", None),
    ("十日前に猫を飼いました", "2024-06-02", None),
    ("三年前に引っ越しました", "2021-06-12", None),
    ("2019年から東京に住んでいます", "2019-01-01", None),
    ("3年前から東京に住んでいます", "2021-06-12", None),
    ("去年以来ベジタリアンです", "2023-01-01", None),
    ("2020年まで大阪に住んでいました", None, "2021-01-01"),
    ("3月まで大阪にいました", None, "2024-04-01"),
    ("2019年から2021年まで大阪に住んでいました", "2019-01-01", "2022-01-01"),
]
JAPANESE_NOT_READ = [
    "明日香さんに会いました",  # a name
    "今日子さんは友達です",
    "先週末は京都にいました",  # last weekend
    "週末は京都にいます",
    "3月までに終わらせます",  # by March: a deadline
    "2019年以前は大阪に住んでいました",  # before 2019
    "以前は大阪に住んでいました",  # formerly
    "数日前に引っ越しました",  # vague
    "3年間東京に住んでいました",  # a duration
    "1990年代の音楽が好きです",
    "日曜日にジョギングします",
    "毎日ジョギングします",
]

CASES = {"de": GERMAN_CASES, "es": SPANISH_CASES, "zh": CHINESE_CASES, "ja": JAPANESE_CASES}
NOT_READ = {"de": GERMAN_NOT_READ, "es": SPANISH_NOT_READ, "zh": CHINESE_NOT_READ, "ja": JAPANESE_NOT_READ}
WORDS = {"de": GERMAN, "es": SPANISH, "zh": CHINESE, "ja": JAPANESE}


def _said_at(language: str) -> datetime:
    return datetime(*SAID, tzinfo=ZONES[language])


def _midnight(day: str | None, language: str) -> datetime | None:
    return (
        None
        if day is None
        else datetime.combine(date.fromisoformat(day), datetime.min.time(), ZONES[language])
    )


def _failure(language: str, text: str, expected: tuple[str | None, str | None] | None) -> str | None:
    """Why the case does not hold, or None when it does."""
    found = resolve(text, _said_at(language), (language,))
    if expected is None:
        return None if found is None else f"read {found.phrase!r}"
    if found is None:
        return "nothing read"
    want = (_midnight(expected[0], language), _midnight(expected[1], language))
    got = (found.valid_from, found.valid_to)
    return None if got == want else f"{got} != {want}"


def _every_case(language: str) -> list[tuple[str, tuple[str | None, str | None] | None]]:
    return [(text, (start, end)) for text, start, end in CASES[language]] + [
        (text, None) for text in NOT_READ[language]
    ]


def test_each_language_has_at_least_25_cases() -> None:
    for language in CASES:
        assert len(_every_case(language)) >= 25, language
        assert len(NOT_READ[language]) >= 10, language


@pytest.mark.parametrize(
    ("language", "text", "valid_from", "valid_to"),
    [(language, *case) for language, cases in CASES.items() for case in cases],
)
def test_phrase_resolves_to_its_local_start_and_end(
    language: str, text: str, valid_from: str | None, valid_to: str | None
) -> None:
    assert _failure(language, text, (valid_from, valid_to)) is None


@pytest.mark.parametrize(
    ("language", "text"), [(language, text) for language, texts in NOT_READ.items() for text in texts]
)
def test_not_a_time_phrase(language: str, text: str) -> None:
    assert _failure(language, text, None) is None


# --- the span the writer cuts out, and who reads what -----------------------------------------------


@pytest.mark.parametrize(
    ("language", "text", "phrase"),
    [
        ("de", "Ich bin letzten Monat nach Berlin gezogen", "letzten Monat"),
        ("de", "Ich wohne seit drei Jahren in Berlin", "seit drei Jahren"),
        ("es", "Mañana por la mañana vuelo a Roma", "Mañana"),
        ("es", "Me mudé a Madrid el año pasado", "el año pasado"),
        ("zh", "我2024年3月3日搬到了北京", "2024年3月3日"),
        ("zh", "我在2019年搬到了北京", "在2019年"),
        ("ja", "2019年から東京に住んでいます", "2019年から"),
        ("ja", "２０２４年３月３日に引っ越しました", "２０２４年３月３日に"),
        ("ja", "今日は仕事を辞めました", "今日は"),
    ],
)
def test_the_phrase_is_the_text_as_written(language: str, text: str, phrase: str) -> None:
    found = resolve(text, _said_at(language), (language,))
    assert found is not None
    assert (found.phrase, text[found.start : found.end]) == (phrase, phrase)


def test_a_language_is_read_only_where_named() -> None:
    said_at = _said_at("es")
    # English only, by default: "Hoy" is an island, and the English phrase is the one read.
    found = resolve("We sailed to Hoy last week", said_at)
    assert found is not None
    assert found.phrase == "last week"
    assert resolve("Ayer adopté un gato", said_at) is None
    # Named together, the first phrase in the text wins whichever language it is in.
    found = resolve("Ayer adopté un gato, last week a dog", said_at, ("en", "es"))
    assert found is not None
    assert found.phrase == "Ayer"
    # A language without tables reads nothing.
    assert resolve("Hier j'ai adopté un chat", said_at, ("fr",)) is None


def test_a_query_names_its_whole_stretch_in_any_language() -> None:
    berlin, shanghai = ZONES["de"], ZONES["zh"]
    said_at = datetime(*SAID, tzinfo=berlin)
    assert named_time("Wo habe ich letzte Woche gewohnt?", said_at, ("de",)) == (
        datetime(2024, 6, 3, tzinfo=berlin),
        datetime(2024, 6, 10, tzinfo=berlin),
    )
    assert named_time("¿Dónde vivía desde 2019?", said_at, ("es",)) == (
        datetime(2019, 1, 1, tzinfo=berlin),
        None,
    )
    said_at = datetime(*SAID, tzinfo=shanghai)
    assert named_time("我去年住在哪里？", said_at, ("zh",)) == (
        datetime(2023, 1, 1, tzinfo=shanghai),
        datetime(2024, 1, 1, tzinfo=shanghai),
    )


# --- the tables can fail: each breakage below makes some case of every language fail ----------------


def _shifted(table: dict[str, int]) -> dict[str, int]:
    return {word: value + 1 for word, value in table.items()}


TABLE_BREAKAGES: dict[str, Callable[[TimeWords], TimeWords]] = {
    "each day word a day later": lambda w: replace(w, days=_shifted(dict(w.days))),
    "each period word one period later": lambda w: replace(
        w, periods={word: (step + 1, unit) for word, (step, unit) in w.periods.items()}
    ),
    "each month name the next month": lambda w: replace(
        w, month_names={word: month % 12 + 1 for word, month in w.month_names.items()}
    ),
    "each number word one more": lambda w: replace(w, numbers=_shifted(dict(w.numbers))),
    "weeks counted as days": lambda w: replace(
        w, units={word: "day" if unit == "week" else unit for word, unit in w.units.items()}
    ),
    "no guards": lambda w: replace(w, not_after={}, not_before={}, lower_case=()),
}


def _one_day_short(
    original: Callable[..., time_expressions._Period],
) -> Callable[..., time_expressions._Period]:
    def counted_back(count: int, unit: str, moment: time_expressions._Moment) -> time_expressions._Period:
        period = original(count, unit, moment)
        return time_expressions._Period(period.start + timedelta(days=1), period.end + timedelta(days=1))

    return counted_back


CALENDAR_BREAKAGES: dict[str, tuple[str, Callable[[Callable[..., object]], object]]] = {
    '"N ago" a day short': ("_counted_back", _one_day_short),
    "a month alone always this year's": (
        "_most_recent_year_of",
        lambda _: lambda _month, said_on: said_on.year,
    ),
}


def _failing(language: str) -> list[str]:
    return [
        text for text, expected in _every_case(language) if _failure(language, text, expected) is not None
    ]


@pytest.mark.parametrize("language", list(CASES))
@pytest.mark.parametrize("breakage", list(TABLE_BREAKAGES))
def test_a_broken_table_fails_some_case(
    language: str, breakage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _failing(language) == []
    broken = TABLE_BREAKAGES[breakage](WORDS[language])
    monkeypatch.setitem(time_expressions._READINGS, language, time_expressions._reading_of(broken))
    assert _failing(language) != []


@pytest.mark.parametrize("language", list(CASES))
@pytest.mark.parametrize("breakage", list(CALENDAR_BREAKAGES))
def test_a_broken_calendar_fails_some_case(
    language: str, breakage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _failing(language) == []
    name, breaking = CALENDAR_BREAKAGES[breakage]
    monkeypatch.setattr(time_expressions, name, breaking(getattr(time_expressions, name)))
    assert _failing(language) != []
