"""The offline writer: deterministic rules that turn explicit first-person statements into memories.

It needs no model, so the service runs with nothing but Postgres and Redis. It is a baseline: it reads
only the user's own sentences ("I live in Lyon", "my daughter's name is Ana"), phrases each fact in one
canonical third-person form, and reconciles with candidates by parsing that same form back out of them.
A message with no English statement is read with a few rules in German, Spanish, Chinese and Japanese
(where the user lives, what they mainly use), each fact written in its own language.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from app.lib.time_expressions import resolve
from app.writers.base import Candidate, Op, OpKind, WriteRequest, WriteResult

# Bump when the rules change what they extract, so changesets show which rule set wrote them.
# 2: facts carry the validity their sentence states; 3: their clause; 4: German, Spanish, Chinese, Japanese
RULES_VERSION = "offline-rules/4"
RULES_HASH = hashlib.sha256(RULES_VERSION.encode()).hexdigest()

MAX_VALUE_CHARS = 100  # longer captures are run-on clauses more often than facts; they are dropped

_FLAGS = re.IGNORECASE


# --- words and phrases ------------------------------------------------------------------------------

_NUMBER = (
    r"(?:a|an|one|two|three|four|five|six|seven|eight|nine|ten|a\s+few|a\s+couple(?:\s+of)?|several|some|many"
    r"|\d+)"
)
_UNIT = r"(?:days?|weeks?|months?|years?|decades?)"
_MONTH = r"(?:january|february|march|april|may|june|july|august|september|october|november|december)"
_PERIOD = (
    r"(?:week|weekend|month|year|summer|winter|spring|fall|autumn|night|semester"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
)
_TIME = (
    rf"(?:(?:last|this|past)\s+{_PERIOD}|{_NUMBER}\s+{_UNIT}\s+ago|(?:a\s+)?(?:long\s+)?(?:while|time)\s+ago"
    rf"|yesterday|today|tonight|recently|lately|earlier(?:\s+this\s+{_PERIOD})?|the\s+other\s+day"
    rf"|(?:back\s+)?in\s+\d{{4}}|(?:back\s+)?in\s+{_MONTH}(?:\s+\d{{4}})?|since\s+\d{{4}}"
    rf"|for\s+(?:the\s+(?:past|last)\s+)?{_NUMBER}\s+(?:\w+\s+)?{_UNIT}"
    r"|right\s+now|now|currently|these\s+days|nowadays|at\s+the\s+moment|for\s+now)"
)
_FILLER = (
    r"(?:too|as\s+well|a\s+lot|so\s+much|very\s+much|a\s+ton|the\s+most|more\s+than\s+anything|though"
    r"|haha+|lol|honestly|actually|really|anyway|anymore|any\s+more|by\s+the\s+way|btw|tbh|either|still"
    r"|to\s+be\s+honest|for\s+sure|sometimes|in\s+general)"
)
# Lead-ins that may precede the subject of a statement without changing its meaning.
_LEAD_IN = re.compile(
    r"^(?:(?:yeah|yes|yep|yup|no|nope|well|so|oh|ah|ok|okay|actually|also|and|but|btw|by\s+the\s+way"
    r"|anyway|anyways|hi|hey|hello|um|uh|honestly|frankly|fun\s+fact|fyi|sure|haha+|lol|wow|of\s+course"
    rf"|you\s+know|in\s+fact|plus|then|as\s+you\s+know|for\s+the\s+record|{_TIME})\b[\s,:!\-]*)",
    _FLAGS,
)
# "Mel, I ..." / "After work, I ..." — a short comma-separated lead-in before the subject.
_SHORT_LEAD_IN = re.compile(r"^([a-z' ]{1,30}),\s+(?=(?:i|i'm|im|my|call|you\s+can\s+call)\b)", _FLAGS)
_BLOCKING_LEAD_WORDS = frozenset(
    re.findall(
        r"\w+",
        "if when whenever unless once since because while although though as before after until whether "
        "suppose imagine maybe perhaps hypothetically even what how why where who do does did i my we he she "
        "they you would could should might",
    )
)
_ADVERBS = (
    r"(?:(?:just|recently|actually|really|also|still|now|currently|finally|already|definitely|totally"
    r"|absolutely|truly|honestly|genuinely|personally|do|even|kind\s+of|kinda|sort\s+of|pretty\s+much"
    r"|usually|generally|always|certainly|seriously|literally|so|very)\s+)*"
)
_I = r"i\s+" + _ADVERBS  # "I ", "I really "
_IM = r"(?:i'm|i\s+am|im)\s+" + _ADVERBS  # "I'm ", "I am actually "
_IVE = r"(?:i've|i\s+have|ive)\s+" + _ADVERBS
_DONT = r"(?:don't|do\s+not|dont)\s+" + _ADVERBS
_NO_LONGER = r"(?:no\s+longer|not)\s+" + _ADVERBS
_ANYMORE = r"\s+any\s?more\b.*"
# A person's or pet's name: first word in any case, then only capitalised words ("Ana", "Mary Jane").
_NAME = r"(?P<v>[a-z][\w'\-]*(?:\s+(?-i:[A-Z])[\w'\-]*){0,3})"
_CAPITALISED_NAME = r"(?P<v>(?-i:[A-Z])[\w'\-]*(?:\s+(?-i:[A-Z])[\w'\-]*){0,3})"
_RELATIONS = (
    r"(?P<rel>(?:(?:older|younger|oldest|eldest|youngest|little|big|baby|twin|step)\s*)?"
    r"(?:daughter|son|wife|husband|partner|sister|brother|mother|mom|mum|father|dad|boyfriend|girlfriend"
    r"|fianc[eé]e?|dog|cat|puppy|kitten))"
)
_RELATION_ALIASES = {"mom": "mother", "mum": "mother", "dad": "father"}
_PETS = frozenset({"dog", "cat", "puppy", "kitten"})
_DIETS = r"(?P<v>vegetarian|vegan|pescatarian|pescetarian)(?![\w-])"

# Where a captured value stops: a new clause, a reason, an aside.
_GENERAL_CUT = re.compile(
    r"\s*[,:(\[]\s*(?=(?:but|so|because|'?cause|'?cos|cuz|which|where|who|though|although|while|it|it's"
    r"|its|that|this|they|he|she|we|you|i|i'm|i've|my|since|as|especially|like|lol|haha|plus|even|sorry"
    r"|thanks|thank|please|ok|okay|right|btw|honestly|tbh)\b)"
    r"|\s'?(?:because|cause|cuz|cos|since|although|though|but|so\s+that|which|who|whom|whose|where|when|while"
    r"|whereas|unless|if|until|whenever)\b"
    r"|\s+and\s+(?=(?:it|it's|that|this|they|them|he|she|we|you|so|then|also|now|love|like|enjoy|want|hope"
    r"|think|have|had|was|is|am|are|really|just|can|will|would|i)\b)"
    r"|\s*[\u2013\u2014]+\s*|\s*-+\s+|\s*[(\[]",
    _FLAGS,
)
_PLACE_CUT = re.compile(r"\s(?:to|for|with|after|before|because)\b|\s+and\s+(?-i:[a-z])", _FLAGS)
_TOOL_CUT = re.compile(r"\s(?:to|for|when|at|in|every|on|with|since|instead)\b", _FLAGS)
_EMPLOYER_CUT = re.compile(r"\s(?:as|in|on|since|for|with)\b|\s+and\s+(?-i:[a-z])", _FLAGS)
_ROLE_CUT = re.compile(r"\s(?:at|for|in|since|with)\b|\s+and\s+(?-i:[a-z])", _FLAGS)
_TRAILING_NOISE = re.compile(
    rf"(?:[\s.,!?;:\"'*~\u2026\u201c\u201d\u2018\u2019]+|\s+{_TIME}|\s+{_FILLER}|\s*[:;]-?[)(dp])$", _FLAGS
)
_LEADING_NOISE = re.compile(
    rf"^(?:[\s,:\"'*~\u201c\u201d\u2018\u2019]+|{_TIME}\s+|(?:really|actually|honestly|just|still|totally|also|like),?\s+)",
    _FLAGS,
)
_SECOND_PERSON = re.compile(r"\b(?:you|your|yours|yourself)\b", _FLAGS)
# "I like holding them": a value that leans on something said before is not a fact on its own.
_ANAPHORA = re.compile(r"\b(?:it|him|her|his|them|they|this|these|those|that)\b")  # lowercase only
# After a comma a thing goes on only as a list ("hiking, reading and cooking"); anything else is an aside.
_COMMA = re.compile(r"\s*,\s*")
_LIST_TAIL = re.compile(r"(?:[^,]+,\s*)*(?:[^,]*\s)?(?:and|or)\s+[^,]+", _FLAGS)
_FIRST_PERSON_CLAUSE = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|im)\b", _FLAGS)
_POSSESSIVES = {"my": "their", "me": "them", "myself": "themselves", "mine": "theirs"}
_POSSESSIVE = re.compile(r"\b(?:my|me|myself|mine)\b", _FLAGS)
# Values that point at something said elsewhere ("I love that!") rather than name a thing.
_VAGUE_START = re.compile(
    r"^(?:it|it's|its|that|that's|this|these|those|them|they|he|him|she|her|his|their|what|how|when|where"
    r"|which|who|why|the\s+idea|both|all\s+of\s+(?:it|that|this|them)|everything|something|anything|nothing"
    r"|so|such|too|to\s+(?:hear|see|know|help|talk|chat|say|think)|hearing|seeing|talking|chatting"
    r"|there|here|one|ones|some|the\s+fact|a\s+lot|each\s+other|one\s+another)\b",
    _FLAGS,
)
# Words that cannot be a value on their own ("I love to.").
_FUNCTION_WORDS = frozenset(
    re.findall(
        r"\w+", "a an the to of do it so and or too more much many all some any just very with for in on at"
    )
)
_INITIALISM_END = re.compile(r"(?:\b[a-z]\.)+[a-z]$", _FLAGS)  # "D.C" once the final period was trimmed
_VAGUE_PLACE = frozenset(
    {
        "town",
        "the city",
        "the area",
        "a new place",
        "the country",
        "the moment",
        "the past",
        "peace",
        "fear",
        "hope",
        "denial",
        "work",
        "home",
        "school",
        "the office",
        "the future",
        "here",
        "there",
    }
)
_VAGUE_EMPLOYER = frozenset(
    {"home", "night", "nights", "weekends", "the weekend", "the moment", "themselves"}
)
_NOT_A_NAME = frozenset(
    re.findall(
        r"\w+",
        "monday tuesday wednesday thursday friday saturday sunday tomorrow tonight today later back anytime "
        "maybe sometime crazy old",
    )
)


# --- facts ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Fact:
    """One thing the user stated (or retracted) about themselves, keyed by the slot it fills."""

    slot: str  # "location", "favorite:book", "preference:green tea" — one value per slot
    label: str  # how a reason names the slot: "location", "preference for green tea"
    value: str  # what fills the slot, compared case-insensitively: "Seattle", "likes"
    content: str = ""  # the memory text; empty for a retraction
    tags: tuple[str, ...] = ()
    retracts: bool = False  # the user said this value no longer holds
    # When it held, from a time expression of its sentence against the message's time ("since 2019",
    # "until last year", "last month"; `time_expressions`); None where the sentence names no time.
    valid_from: datetime | None = None
    valid_to: datetime | None = None


def _single(slot: str, label: str, tag: str, template: str) -> Callable[[dict[str, str]], _Fact]:
    def make(v: dict[str, str]) -> _Fact:
        return _Fact(slot, label, v["v"], template.format(**v), (tag,))

    return make


def _retraction(slot: str) -> Callable[[dict[str, str]], _Fact]:
    def make(v: dict[str, str]) -> _Fact:
        return _Fact(slot, slot, v["v"], retracts=True)

    return make


def _preference(v: dict[str, str], polarity: str) -> _Fact:
    thing = v["v"]
    return _Fact(
        f"preference:{_key(thing)}",
        f"preference for {thing}",
        polarity,
        f"The user {polarity} {thing}.",
        ("preferences",),
    )


def _likes(v: dict[str, str]) -> _Fact:
    return _preference(v, "likes")


def _dislikes(v: dict[str, str]) -> _Fact:
    return _preference(v, "dislikes")


def _like_retraction(v: dict[str, str]) -> _Fact:
    return _Fact(f"preference:{_key(v['v'])}", f"preference for {v['v']}", "likes", retracts=True)


def _dislikes_or_retraction(v: dict[str, str]) -> _Fact:
    """'I don't like X' is a dislike; 'I don't like X anymore' only withdraws the earlier like."""
    return _like_retraction(v) if v.get("anymore") else _dislikes(v)


def _allergy(v: dict[str, str]) -> _Fact:
    what = v["v"]
    return _Fact(
        f"allergy:{_key(what)}",
        f"allergy to {what}",
        "allergic",
        f"The user is allergic to {what}.",
        ("health",),
    )


def _allergy_retraction(v: dict[str, str]) -> _Fact:
    return _Fact(f"allergy:{_key(v['v'])}", "allergy", "allergic", retracts=True)


def _uses(v: dict[str, str]) -> _Fact:
    tool = v["v"]
    return _Fact(f"uses:{_key(tool)}", f"use of {tool}", "uses", f"The user uses {tool}.", ("tools",))


def _uses_retraction(v: dict[str, str]) -> _Fact:
    return _Fact(f"uses:{_key(v['v'])}", "tool", "uses", retracts=True)


def _diet(v: dict[str, str]) -> _Fact:
    diet = v["v"].lower().replace("pescetarian", "pescatarian")
    return _Fact("diet", "diet", diet, f"The user is {diet}.", ("diet",))


def _no_meat(_: dict[str, str]) -> _Fact:
    return _diet({"v": "vegetarian"})


def _diet_retraction(v: dict[str, str]) -> _Fact:
    return _Fact("diet", "diet", v["v"].lower().replace("pescetarian", "pescatarian"), retracts=True)


def _meat_again(_: dict[str, str]) -> _Fact:
    return _Fact("diet", "diet", "vegetarian", retracts=True)


def _employer(v: dict[str, str]) -> _Fact:
    prep = v.get("prep", "at").lower()
    return _Fact("employer", "employer", v["v"], f"The user works {prep} {v['v']}.", ("work",))


def _relation(v: dict[str, str]) -> _Fact:
    relation = " ".join(v["rel"].lower().split())
    relation = " ".join(_RELATION_ALIASES.get(word, word) for word in relation.split())
    tag = "pets" if relation.split()[-1] in _PETS else "family"
    return _Fact(
        f"relation:{relation}",
        f"{relation}'s name",
        v["v"],
        f"The user's {relation} is named {v['v']}.",
        (tag,),
    )


def _favorite(v: dict[str, str]) -> _Fact:
    thing = " ".join(v["thing"].split())
    verb = v.get("verb", "is").lower()
    return _Fact(
        f"favorite:{_key(thing)}",
        f"favorite {thing}",
        v["v"],
        f"The user's favorite {thing} {verb} {v['v']}.",
        ("preferences",),
    )


_location = _single("location", "location", "location", "The user lives in {v}.")
_origin = _single("origin", "origin", "origin", "The user is from {v}.")
_name = _single("name", "name", "name", "The user's name is {v}.")
_age = _single("age", "age", "age", "The user is {v} years old.")
_occupation = _single("occupation", "occupation", "work", "The user works as {v}.")
_primary_tool = _single("primary_tool", "primary tool", "tools", "The user mainly uses {v}.")


# --- rules: what a user's clause may say ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Rule:
    """A clause pattern, how each captured group is cleaned, and the fact it states."""

    pattern: re.Pattern[str]
    make: Callable[[dict[str, str]], _Fact]
    cut: re.Pattern[str] | None = None  # extra stops for the "v" group beyond the general ones
    kind: str = "thing"  # thing | name | raw — how the "v" group is cleaned
    reject: frozenset[str] = frozenset()  # values that match the shape but say nothing ("the moment")


def _rule(
    pattern: str,
    make: Callable[[dict[str, str]], _Fact],
    cut: re.Pattern[str] | None = None,
    kind: str = "thing",
) -> _Rule:
    reject = _VAGUE_PLACE if cut is _PLACE_CUT else _VAGUE_EMPLOYER if cut is _EMPLOYER_CUT else frozenset()
    return _Rule(re.compile(pattern, _FLAGS), make, cut, kind, reject)


_RULES: tuple[_Rule, ...] = (
    # Retractions come first: "I don't live in X anymore" must not read as anything else.
    _rule(
        rf"{_I}(?:{_NO_LONGER}|{_DONT})(?:live|reside)\s+in\s+(?P<v>.+?)(?:{_ANYMORE})?$",
        _retraction("location"),
        cut=_PLACE_CUT,
    ),
    _rule(rf"{_IM}no\s+longer\s+(?:living|based)\s+in\s+(?P<v>.+)$", _retraction("location"), cut=_PLACE_CUT),
    _rule(rf"{_I}moved\s+away\s+from\s+(?P<v>.+)$", _retraction("location"), cut=_PLACE_CUT),
    _rule(
        rf"{_IM}(?:not|no\s+longer)\s+(?:a\s+)?(?P<v>vegetarian|vegan|pescatarian|pescetarian)(?![\w-]).*$",
        _diet_retraction,
        kind="raw",
    ),
    _rule(
        rf"{_I}stopped\s+being\s+(?:a\s+)?(?P<v>vegetarian|vegan|pescatarian|pescetarian)(?![\w-]).*$",
        _diet_retraction,
        kind="raw",
    ),
    _rule(rf"{_I}(?:eat|started\s+eating)\s+meat\s+again\b.*$", _meat_again, kind="raw"),
    _rule(rf"{_IM}(?:not|no\s+longer)\s+allergic\s+to\s+(?P<v>.+?)(?:{_ANYMORE})?$", _allergy_retraction),
    _rule(rf"{_I}no\s+longer\s+(?:like|love|enjoy)\s+(?P<v>.+)$", _like_retraction),
    _rule(rf"{_I}stopped\s+(?:liking|loving|enjoying)\s+(?P<v>.+)$", _like_retraction),
    _rule(rf"{_I}(?:{_NO_LONGER}|{_DONT})use\s+(?P<v>.+?)(?:{_ANYMORE})?$", _uses_retraction, cut=_TOOL_CUT),
    _rule(rf"{_I}stopped\s+using\s+(?P<v>.+)$", _uses_retraction, cut=_TOOL_CUT),
    _rule(rf"{_I}{_DONT}(?:like|love|enjoy)\s+(?P<v>.+?)(?P<anymore>{_ANYMORE})?$", _dislikes_or_retraction),
    # Where the user lives and comes from.
    _rule(rf"{_I}(?:live|reside)\s+in\s+(?P<v>.+)$", _location, cut=_PLACE_CUT),
    _rule(rf"{_IM}(?:living|based)\s+in\s+(?P<v>.+)$", _location, cut=_PLACE_CUT),
    _rule(rf"{_IVE}been\s+living\s+in\s+(?P<v>.+)$", _location, cut=_PLACE_CUT),
    _rule(rf"(?:{_IVE}|{_I})(?:moved|relocated)\s+(?:back\s+)?to\s+(?P<v>.+)$", _location, cut=_PLACE_CUT),
    _rule(rf"{_IM}(?:originally\s+)?from\s+(?P<v>.+)$", _origin, cut=_PLACE_CUT),
    _rule(rf"{_I}(?:originally\s+)?come\s+from\s+(?P<v>.+)$", _origin, cut=_PLACE_CUT),
    _rule(rf"(?:{_I}grew\s+up|i\s+was\s+born\s+and\s+raised)\s+in\s+(?P<v>.+)$", _origin, cut=_PLACE_CUT),
    # Who the user is.
    _rule(rf"my\s+(?:first\s+|full\s+)?name(?:'s|\s+is)\s+{_NAME}", _name, kind="name"),
    _rule(
        rf"(?:(?:you|u)\s+can\s+|please\s+|just\s+|feel\s+free\s+to\s+)*call\s+me\s+{_CAPITALISED_NAME}",
        _name,
        kind="name",
    ),
    _rule(
        rf"(?:everyone|people|friends|my\s+friends)\s+calls?\s+me\s+{_CAPITALISED_NAME}", _name, kind="name"
    ),
    _rule(rf"{_IM}(?P<v>\d{{1,3}})\s+(?:years?|yrs?)\s+old\b(?P<rest>.*)$", _age, kind="raw"),
    _rule(rf"{_I}turned\s+(?P<v>\d{{1,3}})(?:\s+(?:years?|yrs?)\s+old)?(?P<rest>.*)$", _age, kind="raw"),
    _rule(rf"(?:{_IM}|{_IVE}been\s+)(?:(?:a|now|also|fully|strictly|an)\s+)*{_DIETS}", _diet, kind="raw"),
    _rule(rf"{_I}(?:{_DONT}|never\s+)eat\s+(?:meat|any\s+meat)\b.*$", _no_meat, kind="raw"),
    _rule(rf"{_IM}(?:(?:very|severely|mildly|deathly|highly|super)\s+)*allergic\s+to\s+(?P<v>.+)$", _allergy),
    # Work and tools.
    _rule(rf"{_I}work\s+(?P<prep>at|for)\s+(?P<v>.+)$", _employer, cut=_EMPLOYER_CUT),
    _rule(rf"{_I}work\s+as\s+(?P<v>.+)$", _occupation, cut=_ROLE_CUT),
    _rule(rf"{_IM}(?P<v>an?\s+.+?)\s+by\s+(?:profession|trade)\b.*$", _occupation, cut=_ROLE_CUT),
    _rule(
        r"my\s+(?:job|profession|occupation)\s+is\s+(?:being\s+)?(?P<v>an?\s+.+)$", _occupation, cut=_ROLE_CUT
    ),
    _rule(rf"{_I}(?:mainly|mostly|primarily)\s+use\s+(?P<v>.+)$", _primary_tool, cut=_TOOL_CUT),
    _rule(
        r"my\s+(?:main|primary)\s+(?:programming\s+)?(?:language|tool|editor|ide)\s+is\s+(?P<v>.+)$",
        _primary_tool,
        cut=_TOOL_CUT,
    ),
    _rule(rf"{_I}use\s+(?!to\b)(?P<v>.+)$", _uses, cut=_TOOL_CUT),
    # Family and pets.
    _rule(
        rf"my\s+{_RELATIONS}(?:'s\s+name(?:'s|\s+is)|\s+is\s+(?:called|named)|'s\s+called)\s+{_NAME}",
        _relation,
        kind="name",
    ),
    # Preferences.
    _rule(
        r"my\s+(?:all[-\s]time\s+|absolute\s+|personal\s+)?favou?rite\s+(?P<thing>[a-z][\w'\- ]{0,38}?)\s+"
        r"(?P<verb>is|are)\s+(?P<v>.+)$",
        _favorite,
    ),
    _rule(rf"{_I}(?:like|love|enjoy|adore)\s+(?P<v>.+)$", _likes),
    _rule(rf"{_IVE}(?:always\s+)?(?:liked|loved|enjoyed)\s+(?P<v>.+)$", _likes),
    _rule(rf"{_IM}(?:a\s+)?(?:(?:huge|big|great|massive)\s+)?fan\s+of\s+(?P<v>.+)$", _likes),
    _rule(rf"{_IM}into\s+(?P<v>.+)$", _likes),
    _rule(rf"{_I}(?:dislike|hate|detest|can't\s+stand|cannot\s+stand|cant\s+stand)\s+(?P<v>.+)$", _dislikes),
    _rule(rf"{_IM}not\s+(?:a\s+)?(?:(?:huge|big|great)\s+)?fan\s+of\s+(?P<v>.+)$", _dislikes),
)


# --- phrasings: how a candidate's content is read back into a slot ----------------------------------

_PHRASINGS: tuple[tuple[re.Pattern[str], Callable[[dict[str, str]], _Fact]], ...] = tuple(
    (re.compile(pattern, _FLAGS), make)
    for pattern, make in (
        (r"the user lives in (?P<v>.+)", _location),
        (r"the user is from (?P<v>.+)", _origin),
        (r"the user's name is (?P<v>.+)", _name),
        (r"the user is (?P<v>\d{1,3}) years old", _age),
        (r"the user is (?P<v>vegetarian|vegan|pescatarian)", _diet),
        (r"the user is allergic to (?P<v>.+)", _allergy),
        (r"the user works (?P<prep>at|for) (?P<v>.+)", _employer),
        (r"the user works as (?P<v>.+)", _occupation),
        (r"the user mainly uses (?P<v>.+)", _primary_tool),
        (r"the user uses (?P<v>.+)", _uses),
        (r"the user's favou?rite (?P<thing>.+?) (?P<verb>is|are) (?P<v>.+)", _favorite),
        (r"the user's (?P<rel>[\w ]+?) is named (?P<v>.+)", _relation),
        (r"the user likes (?P<v>.+)", _likes),
        (r"the user dislikes (?P<v>.+)", _dislikes),
        # What the other languages' rules write (below), so a move told in one language replaces a place
        # told in another.
        (r"der nutzer wohnt in (?P<v>.+)", _location),
        (r"der nutzer benutzt hauptsächlich (?P<v>.+)", _primary_tool),
        (r"el usuario vive en (?P<v>.+)", _location),
        (r"el usuario usa principalmente (?P<v>.+)", _primary_tool),
        (r"用户住在(?P<v>.+?)。?", _location),
        (r"用户主要使用(?P<v>.+?)。?", _primary_tool),
        (r"ユーザーは(?P<v>.+?)に住んでいる。?", _location),
        (r"ユーザーは主に(?P<v>.+?)を使っている。?", _primary_tool),
    )
)


def _read_candidate(candidate: Candidate) -> _Fact | None:
    """The slot and value of a memory written in this writer's canonical phrasing, else None."""
    text = " ".join(candidate.content.split()).rstrip(". ")
    for pattern, make in _PHRASINGS:
        match = pattern.fullmatch(text)
        if match:
            return make({k: v for k, v in match.groupdict().items() if v is not None})
    return None


# --- reading the user's messages --------------------------------------------------------------------

_SENTENCE_BREAK = re.compile(r"[.!?]+[\"')\]\u201d\u2019]*\s+|[;\n]+")
_ABBREVIATIONS = frozenset(
    {"st", "mr", "mrs", "ms", "dr", "mt", "ft", "jr", "sr", "vs", "etc", "e.g", "i.e", "u.s", "d.c"}
)
_CLAUSE_BREAK = re.compile(
    r"\s*,\s*(?:(?:and|but|so)\s+)?(?=(?:i|i'm|i've|im|my)\b)|\s+(?:and|but|so)\s+(?=(?:i|i'm|i've|im|my)\b)",
    _FLAGS,
)
_STARTS_WITH_SUBJECT = re.compile(r"^(?:i|i'm|i've|im|my)\b", _FLAGS)
_QUESTION = re.compile(r"\?[\W_]*$")


def _sentences(text: str) -> Iterator[str]:
    """Split on . ! ? ; and newlines, but not after "St." or "Dr." or inside "Node.js"."""
    start = 0
    for match in _SENTENCE_BREAK.finditer(text):
        if match.group().startswith("."):
            last_word = text[start : match.start()].rsplit(None, 1)[-1:] or [""]
            if last_word[0].lower() in _ABBREVIATIONS:
                continue
        yield text[start : match.end()].strip()
        start = match.end()
    if start < len(text):
        yield text[start:].strip()


def _strip_lead_in(clause: str) -> str:
    while True:
        stripped = _LEAD_IN.sub("", clause, count=1)
        short = _SHORT_LEAD_IN.match(stripped)
        if short and not _BLOCKING_LEAD_WORDS.intersection(short.group(1).lower().split()):
            stripped = stripped[short.end() :]
        if stripped == clause:
            return clause
        clause = stripped


def _clauses(sentence: str) -> Iterator[tuple[str, str]]:
    """Split a sentence on ", and I" / " but my" etc. — only where both sides are first-person statements.

    Yields each part as written (lead-in included: "Last month I moved ..." keeps its time phrase) and
    the clause a rule reads.
    """
    parts: list[str] = []
    start = 0
    for match in _CLAUSE_BREAK.finditer(sentence):
        left = sentence[start : match.start()]
        if _STARTS_WITH_SUBJECT.match(_strip_lead_in(left.strip())):
            parts.append(left)
            start = match.end()
    parts.append(sentence[start:])
    for part in parts:
        clause = _strip_lead_in(part.strip())
        if clause:
            yield part.strip(), clause


def _clean(raw: str, cut: re.Pattern[str] | None) -> str | None:
    """Trim a captured value to the fact itself, or None when what is left does not name anything."""
    value = raw.replace("\u2019", "'")
    for stop in (_GENERAL_CUT, cut):
        if stop is not None:
            found = stop.search(value)
            if found:
                value = value[: found.start()]
    comma = _COMMA.search(value)
    if comma and cut is not _PLACE_CUT and not _LIST_TAIL.fullmatch(value[comma.end() :].strip()):
        value = value[: comma.start()]  # places keep theirs: "Portland, Oregon"
    previous = None
    while previous != value:
        previous = value
        value = _TRAILING_NOISE.sub("", value)
        value = _LEADING_NOISE.sub("", value)
    value = " ".join(value.split())
    if _INITIALISM_END.search(value) and raw.replace("\u2019", "'").startswith(value + "."):
        value += "."  # keep "Washington D.C." whole
    if (
        not value
        or _FUNCTION_WORDS.issuperset(value.lower().split())
        or len(value) > MAX_VALUE_CHARS
        or not any(ch.isalnum() for ch in value)
        or _VAGUE_START.match(value)
        or _SECOND_PERSON.search(value)
        or _ANAPHORA.search(value)
        or _FIRST_PERSON_CLAUSE.search(value)
    ):
        return None
    return _POSSESSIVE.sub(lambda m: _POSSESSIVES[m.group().lower()], value)


def _clean_name(raw: str) -> str | None:
    name = raw.strip(" '-")
    if not name or name.lower() in _NOT_A_NAME or _FIRST_PERSON_CLAUSE.fullmatch(name):
        return None
    return name


def _fact_of(clause: str) -> _Fact | None:
    """The first rule that matches the clause and leaves a usable value decides what it states."""
    for rule in _RULES:
        match = rule.pattern.match(clause)
        if not match:
            continue
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        if "rest" in groups and _clean("x " + groups.pop("rest"), None) != "x":
            continue  # "I turned 30 pages" is not an age
        if "v" in groups:
            value = (
                _clean_name(groups["v"])
                if rule.kind == "name"
                else groups["v"]
                if rule.kind == "raw"
                else _clean(groups["v"], rule.cut)
            )
            if value is None or rule.reject.intersection((value.lower(), value.lower().split()[0])):
                continue
            groups["v"] = value
        if "thing" in groups:
            thing = _clean(groups["thing"], None)
            if thing is None:
                continue
            groups["thing"] = thing
        if rule.kind == "raw" and "v" in groups and groups["v"].isdigit() and not 0 < int(groups["v"]) <= 120:
            continue
        return rule.make(groups)
    return None


def _statements(request: WriteRequest) -> Iterator[_Fact]:
    """Facts the user stated in this chunk, in order of appearance."""
    for message in request.messages:
        if message.role != "user":
            continue
        text = message.content.replace("\u2019", "'").replace("\u2018", "'")
        said_at = message.created_at or request.memory_at
        if said_at.tzinfo is None:
            said_at = said_at.replace(tzinfo=UTC)
        english = list(_english_statements(text, said_at))
        yield from english if english else _statements_in_other_languages(text, said_at)


def _english_statements(text: str, said_at: datetime) -> Iterator[_Fact]:
    for sentence in _sentences(text):
        if not sentence or _QUESTION.search(sentence):
            continue
        # A time phrase dates its own clause only: in "I moved to Seattle last month and I mainly
        # use Python" the move happened last month, not the using of Python.
        for part, clause in _clauses(sentence):
            fact = _fact_of(clause)
            if fact is None:
                continue
            validity = resolve(part, said_at)
            if validity is not None:
                fact = replace(fact, valid_from=validity.valid_from, valid_to=validity.valid_to)
            yield fact


# --- statements in German, Spanish, Chinese and Japanese --------------------------------------------
# A few rules each: where the user lives (or moved to) and what they mainly use. A sentence is split
# into clauses where a new statement starts ("..., und ich benutze ...", a comma before 我, "、"),
# and each clause's time phrase, read in the clause's language, dates that clause's fact only. The
# phrase is taken out of the clause before the rules read it: "Ich wohne seit 2019 in Berlin" reads as
# "Ich wohne in Berlin", valid from 2019. A sentence is in the language of the first rules that read it.


@dataclass(frozen=True, slots=True)
class _Language:
    """How the writer reads statements in one language besides English."""

    code: str  # ISO 639-1, as `time_expressions` reads it
    spaced: bool  # words are separated by spaces
    clause_break: re.Pattern[str]  # where a sentence's next statement starts
    lead_in: re.Pattern[str]  # words before a statement that change nothing ("und", "そして")
    cut: re.Pattern[str]  # where a captured value stops
    vague: frozenset[str]  # values that name nothing on their own ("dort", "那里")
    rules: tuple[tuple[re.Pattern[str], Callable[[dict[str, str]], _Fact]], ...]


def _spaced_clause_break(connectives: str, first_words: str) -> re.Pattern[str]:
    """A break at a comma or a connective ("und", "y") that a statement's first word follows: a subject,
    a verb the rules read, or a time phrase's first word."""
    first = rf"(?=(?:{'|'.join(first_words.split())})\b)"
    joined = "|".join(connectives.split())
    return re.compile(rf"\s*,\s*(?:(?:{joined})\s+)?{first}|\s+(?:{joined})\s+{first}", _FLAGS)


def _language_rules(
    *rules: tuple[str, Callable[[dict[str, str]], _Fact]],
) -> tuple[tuple[re.Pattern[str], Callable[[dict[str, str]], _Fact]], ...]:
    return tuple((re.compile(pattern, _FLAGS), make) for pattern, make in rules)


_location_de = _single("location", "location", "location", "Der Nutzer wohnt in {v}.")
_primary_tool_de = _single("primary_tool", "primary tool", "tools", "Der Nutzer benutzt hauptsächlich {v}.")
_location_es = _single("location", "location", "location", "El usuario vive en {v}.")
_primary_tool_es = _single("primary_tool", "primary tool", "tools", "El usuario usa principalmente {v}.")
_location_zh = _single("location", "location", "location", "用户住在{v}。")
_primary_tool_zh = _single("primary_tool", "primary tool", "tools", "用户主要使用{v}。")
_location_ja = _single("location", "location", "location", "ユーザーは{v}に住んでいる。")
_primary_tool_ja = _single("primary_tool", "primary tool", "tools", "ユーザーは主に{v}を使っている。")

# Words that may stand between the subject (or the verb) and the rest without changing the fact.
_DE_ADVERBS = r"(?:(?:jetzt|nun|inzwischen|mittlerweile|derzeit|momentan|zurzeit|schon|bereits|auch)\s+)*"
_ES_ADVERBS = r"(?:(?:ahora|actualmente|ya|también|tambien)\s+)*"
_ZH_ADVERBS = r"(?:现在|目前|已经|一直|也|还)*"
_JA_SUBJECT = r"(?:(?:私|僕|俺)は)?(?:今は|現在は|今|現在|もう)?"
_CJK_VAGUE = frozenset({"这里", "那里", "这儿", "那儿", "這裡", "那裡", "ここ", "そこ", "あそこ"})

_OTHER_LANGUAGES = (
    _Language(
        code="de",
        spaced=True,
        clause_break=_spaced_clause_break(
            "und aber sondern",
            "ich mein meine wohne lebe bin benutze nutze verwende hauptsächlich seit ab vor im am gestern "
            "heute letzte letzten letztes diese diesen dieses nächste nächsten nächstes",
        ),
        lead_in=re.compile(r"^(?:(?:und|aber|also|ja|übrigens|außerdem)\b[\s,]*)+", _FLAGS),
        cut=re.compile(r"\s*[,;:(]|\s+(?:und|aber|weil|denn|mit|bei|seit|für)\b", _FLAGS),
        vague=frozenset({"dort", "hier", "da"}),
        rules=_language_rules(
            # "Ich wohne in X"; "wohne ich in X" after a time phrase; "und wohne in X".
            (rf"(?:ich\s+)?(?:wohne|lebe)(?:\s+ich)?\s+{_DE_ADVERBS}in\s+(?P<v>.+)$", _location_de),
            (rf"(?:ich\s+)?bin(?:\s+ich)?\s+{_DE_ADVERBS}nach\s+(?P<v>.+?)\s+(?:um)?gezogen$", _location_de),
            (
                rf"(?:ich\s+)?(?:benutze|nutze|verwende)(?:\s+ich)?\s+{_DE_ADVERBS}"
                r"(?:hauptsächlich|vor\s+allem|meistens|überwiegend)\s+(?P<v>.+)$",
                _primary_tool_de,
            ),
        ),
    ),
    _Language(
        code="es",
        spaced=True,
        clause_break=_spaced_clause_break(
            "y e pero",
            "yo mi mis vivo me uso utilizo principalmente desde hace hoy ayer el la este esta en",
        ),
        lead_in=re.compile(r"^(?:(?:y|pero|pues|bueno|además|ademas)\b[\s,]*)+", _FLAGS),
        cut=re.compile(r"\s*[,;:(]|\s+(?:y|e|pero|porque|con|desde|para)\b", _FLAGS),
        vague=frozenset({"allí", "alli", "allá", "alla", "aquí", "aqui", "ahí", "ahi"}),
        rules=_language_rules(
            (rf"(?:yo\s+)?{_ES_ADVERBS}vivo\s+{_ES_ADVERBS}en\s+(?P<v>.+)$", _location_es),
            (
                rf"(?:yo\s+)?{_ES_ADVERBS}me\s+(?:mud[ée]|he\s+mudado|traslad[ée]|he\s+trasladado"
                r"|fui\s+a\s+vivir)\s+a\s+(?P<v>.+)$",
                _location_es,
            ),
            (
                rf"(?:yo\s+)?{_ES_ADVERBS}(?:uso|utilizo)\s+(?:principalmente|sobre\s+todo|mayormente)"
                r"\s+(?P<v>.+)$",
                _primary_tool_es,
            ),
            (r"(?:principalmente|sobre\s+todo|mayormente)\s+(?:uso|utilizo)\s+(?P<v>.+)$", _primary_tool_es),
        ),
    ),
    _Language(
        code="zh",
        spaced=False,
        clause_break=re.compile(r"[，,、；]|(?:和|而且|并且|但是|不过)(?=我)"),  # noqa: RUF001
        lead_in=re.compile(r"^(?:而且|并且|但是|不过|还有|另外)+"),
        cut=re.compile(r"[，,、；。]|和|跟|与"),  # noqa: RUF001
        vague=_CJK_VAGUE,
        rules=_language_rules(
            (rf"我{_ZH_ADVERBS}住在(?P<v>.+)$", _location_zh),
            # Moved (了: it happened); "我下个月搬到北京" is a plan, not a fact.
            (rf"我{_ZH_ADVERBS}搬(?:到|去)了(?P<v>.+)$", _location_zh),
            (rf"我{_ZH_ADVERBS}搬(?:到|去)(?P<v>.+?)了$", _location_zh),
            (rf"我?{_ZH_ADVERBS}主要(?:用|使用)(?P<v>.+)$", _primary_tool_zh),
        ),
    ),
    _Language(
        code="ja",
        spaced=False,
        clause_break=re.compile(r"[、，,]"),  # noqa: RUF001
        lead_in=re.compile(r"^(?:そして|それから|でも|あと|また)+"),
        cut=re.compile(r"[、，,。]"),  # noqa: RUF001
        vague=_CJK_VAGUE,
        rules=_language_rules(
            (rf"{_JA_SUBJECT}(?P<v>.+?)に住んで(?:います|いる|る|いて|おり(?:ます)?)$", _location_ja),
            (rf"{_JA_SUBJECT}(?P<v>.+?)に引っ越し(?:ました|た|て(?:きました|きた)?)$", _location_ja),
            (rf"{_JA_SUBJECT}主に(?P<v>.+?)を使(?:って(?:います|いる|る)|います|う)$", _primary_tool_ja),
        ),
    ),
)
# Sentences end at . ! ? before a space (not after a day's number: "am 3. März"), at the full-width
# stops of Chinese and Japanese, and at ; or a new line; a question is not a statement. (The full-width
# punctuation below is meant: it is how those languages are written.)
_OTHER_SENTENCE_BREAK = re.compile(r"(?<!\d)[.!?]+\s+|[。！？]+|[;\n]+")  # noqa: RUF001
_OTHER_QUESTION = re.compile(r"[?？][\W_]*$")  # noqa: RUF001
_PUNCTUATION = ".,!?;:。！？、，；：\"'「」『』()（） \t"  # noqa: RUF001


def _statements_in_other_languages(text: str, said_at: datetime) -> Iterator[_Fact]:
    start = 0
    sentences = []
    for match in _OTHER_SENTENCE_BREAK.finditer(text):
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    for sentence in sentences:
        if not sentence or _OTHER_QUESTION.search(sentence):
            continue
        for language in _OTHER_LANGUAGES:
            parts = language.clause_break.split(sentence)
            facts = [fact for part in parts if (fact := _other_fact(part, language, said_at)) is not None]
            if facts:
                yield from facts
                break


def _other_fact(part: str, language: _Language, said_at: datetime) -> _Fact | None:
    """The fact one clause states in `language`, dated by the clause's own time phrase."""
    validity = resolve(part, said_at, (language.code,))
    clause = part
    if validity is not None:  # the phrase is not part of the fact
        clause = part[: validity.start] + (" " if language.spaced else "") + part[validity.end :]
    clause = " ".join(clause.split()).strip(_PUNCTUATION)
    clause = language.lead_in.sub("", clause).strip(_PUNCTUATION)
    for pattern, make in language.rules:
        match = pattern.match(clause)
        if match is None:
            continue
        value = language.cut.split(match["v"], maxsplit=1)[0].strip(_PUNCTUATION)
        if (
            not value
            or len(value) > MAX_VALUE_CHARS
            or not any(ch.isalnum() for ch in value)
            or value.lower() in language.vague
        ):
            continue
        fact = make({"v": value})
        if validity is not None:
            fact = replace(fact, valid_from=validity.valid_from, valid_to=validity.valid_to)
        return fact
    return None


# --- reconciliation ---------------------------------------------------------------------------------


def _key(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".")


def _matches_retraction(held: _Fact, retracted: _Fact) -> bool:
    if _key(held.value) == _key(retracted.value):
        return True
    # Someone no longer vegetarian is no longer vegan either.
    return held.slot == "diet" and retracted.value == "vegetarian" and held.value == "vegan"


@dataclass
class _SlotDecision:
    """What the chunk ends up saying about one slot: the last assertion standing, and retractions."""

    position: int
    assertion: _Fact | None = None
    retractions: list[_Fact] = field(default_factory=list)


def _reconcile(statements: list[_Fact], candidates: tuple[Candidate, ...]) -> list[Op]:
    """Ops for a chunk's statements against the candidates; at most one op per slot, one per candidate."""
    decisions: dict[str, _SlotDecision] = {}
    for position, fact in enumerate(statements):
        decision = decisions.setdefault(fact.slot, _SlotDecision(position))
        decision.position = position  # the later statement about a slot wins, and places the op
        if not fact.retracts:
            decision.assertion, decision.retractions = fact, []
        else:
            # "I live in Seattle. I no longer live in Lyon." keeps Seattle; retracting Seattle drops it.
            if decision.assertion is not None and _matches_retraction(decision.assertion, fact):
                decision.assertion = None
            decision.retractions.append(fact)

    held: dict[str, list[tuple[Candidate, _Fact]]] = {}
    for candidate in candidates:
        reading = _read_candidate(candidate) if candidate.owner == "user" else None
        if reading is not None:
            held.setdefault(reading.slot, []).append((candidate, reading))

    ops: list[Op] = []
    claimed: set[int] = set()
    for slot, decision in sorted(decisions.items(), key=lambda item: item[1].position):
        holding = [(c, f) for c, f in held.get(slot, []) if c.local_id not in claimed]
        if decision.assertion is not None:
            slot_ops = [_assert(decision.assertion, holding)]
        else:
            slot_ops = [
                Op(
                    OpKind.DELETE,
                    targets=(candidate.local_id,),
                    reason=f"no longer true: {candidate.content}",
                )
                for candidate, fact in holding
                if any(_matches_retraction(fact, retracted) for retracted in decision.retractions)
            ]
        for op in slot_ops:
            ops.append(op)
            claimed.update(op.targets)
    return ops


def _assert(fact: _Fact, holding: list[tuple[Candidate, _Fact]]) -> Op:
    content = fact.content[:-1] if fact.content.endswith("..") else fact.content  # a value ending "D.C."
    if holding and all(_key(held.value) == _key(fact.value) for _, held in holding):
        return Op(OpKind.NOOP, targets=(holding[0][0].local_id,), reason="already known")
    if holding:
        old = " and ".join(
            dict.fromkeys(held.value for _, held in holding if _key(held.value) != _key(fact.value))
        )
        return Op(
            OpKind.SUPERSEDE,
            content=content,
            targets=tuple(candidate.local_id for candidate, _ in holding),
            tags=fact.tags,
            reason=f"{fact.label} changed from {old} to {fact.value}",
            valid_from=fact.valid_from,
            valid_to=fact.valid_to,
        )
    return Op(
        OpKind.ADD,
        content=content,
        tags=fact.tags,
        owner="user",
        reason="stated by the user",
        valid_from=fact.valid_from,
        valid_to=fact.valid_to,
    )


class OfflineWriter:
    """A `Writer` that needs no model: explicit first-person facts from the user's messages, by rule."""

    def __init__(self, name: str = "offline") -> None:
        self.name = name
        self.model: str | None = None
        self.profile: str | None = None
        # Only the chunk's own user statements are evidence, so the scope's earlier messages are not read.
        self.context_messages: int | None = 0
        # Candidates are searched for what was stated, in the memories' own phrasing ("The user lives in
        # Seattle." finds "The user lives in Lyon."), and not at all for a chunk that states nothing.
        self.initial_candidates = False

    async def write(self, request: WriteRequest) -> WriteResult:
        # request.context is deliberately unused: only the chunk's own user statements are evidence.
        statements = list(_statements(request))
        candidates = (
            await request.related([f.content or f"{f.label} {f.value}" for f in statements])
            if statements
            else request.candidates
        )
        ops = _reconcile(statements, candidates) if statements else []
        return WriteResult(ops=ops, raw_output=None, prompt_hash=RULES_HASH, usage={})
