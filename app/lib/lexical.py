"""A text's lexical form in its own language: what BM25 reads of a memory, and of a query.

Postgres stems and drops stop words with a text search configuration, one per language (Snowball's,
`pg_ts_config`), but splits words only at spaces and punctuation: a Chinese or Japanese sentence,
written without spaces, would be one "word". So the text is analysed here, once, where it is written
(`memories.version_writer`) and where a query is read (`search.services`):

- its language is detected (py3langid, restricted to the languages below: a short text is then not
  taken for a close neighbour Memstore has no analyzer for, e.g. German for Luxembourgish; the
  choice must above all be the same for a memory and a question about it);
- Chinese is cut into words by jieba's dictionary (`rjieba`, the Rust port: the same dictionary, loaded
  in a tenth of a second with no cache file), search mode, so "上海浦东" also yields "上海" and "浦东";
  Japanese by TinySegmenter (a small statistical segmenter, no dictionary to install);
- other scripts written without spaces (Thai, Lao, Khmer, Burmese, and Chinese or Japanese characters
  in a text of another language) become overlapping character pairs;
- the words go to Postgres separated by spaces with the language's configuration, `simple` (lower
  case, no stemming) where Postgres has none.

A memory and a query are analysed by the same function, so their lexemes meet whatever the language;
a bank may hold several. Analysing costs some microseconds of CPU per text (Japanese: a fifth of a
millisecond), and no round trip: the lexemes are computed in the statement that writes the text.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# ISO 639-1 code -> Postgres's Snowball configuration of that language: those every supported Postgres
# has (Estonian and Yiddish came with 17, and are read unstemmed).
SNOWBALL = {
    "ar": "arabic",
    "hy": "armenian",
    "eu": "basque",
    "ca": "catalan",
    "da": "danish",
    "nl": "dutch",
    "en": "english",
    "fi": "finnish",
    "fr": "french",
    "de": "german",
    "el": "greek",
    "hi": "hindi",
    "hu": "hungarian",
    "id": "indonesian",
    "ga": "irish",
    "it": "italian",
    "lt": "lithuanian",
    "ne": "nepali",
    "no": "norwegian",
    "pt": "portuguese",
    "ro": "romanian",
    "ru": "russian",
    "sr": "serbian",
    "es": "spanish",
    "sv": "swedish",
    "ta": "tamil",
    "tr": "turkish",
}
# Languages detected without a Snowball configuration: their words are kept as written (lower case).
SEGMENTED = ("zh", "ja")
UNSTEMMED = ("et", "ko", "th", "pl", "cs", "sk", "uk", "bg", "hr", "sl", "lv", "vi", "fa", "he", "ms", "tl")
LANGUAGES = (*SNOWBALL, *SEGMENTED, *UNSTEMMED)
# What a text too short or too plain to tell is taken for (and what a bank held before detection).
DEFAULT_LANGUAGE = "en"

_WORD = re.compile(r"[^\W_]+")  # where a text has something to read at all
_LETTER = re.compile(r"[^\W\d_]")
_KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
# Characters of scripts written without spaces between words.
_UNSPACED = re.compile(
    r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]+"
)
# Words a question about the user names the user by: in every memory's place they say nothing.
USER_WORDS = frozenset(
    """user users nutzer nutzerin benutzer benutzerin usuario usuaria utilisateur utilisatrice utente
    usuário 用户 用戶 ユーザー""".split()  # noqa: SIM905  (a word list)
)
# Function words of the segmented languages (Postgres's `simple` has no stop list): questions are full
# of them, memories too, and they match nothing worth ranking.
_SEGMENTED_STOPWORDS = frozenset(
    """的 了 是 在 吗 呢 吧 啊 什么 哪 哪儿 哪里 哪个 哪些 哪种 谁 怎么 怎样 多少 几 我 你 他 她 它 我们
    他们 有 和 也 都 就 会 要 现在 一 个 这 那 还 对 被 把 给 着 过
    の に は を が で て と も へ や か な だ です ます でし た し い いる ある する ない ません どこ なに 何
    どの どんな だれ 誰 いつ ますか ですか""".split()  # noqa: SIM905  (a word list)
)
MAX_QUERY_WORDS = 64
# A query's language is taken as sure from this probability on; below it (a name, a number, three
# words), the query is read in each likely language until they add up to `_SURE`, at most
# `_MAX_READINGS` of them, as well as in English and unstemmed.
_SURE = 0.5
_MAX_READINGS = 4


@dataclass(frozen=True)
class Analyzed:
    """A text's language, the Postgres configuration that makes its lexemes, and the text it reads."""

    language: str  # ISO 639-1
    config: str  # a text search configuration: `english`, `german`, ..., `simple`
    text: str  # what `to_tsvector(config, text)` reads: the text, or its words separated by spaces


@lru_cache(maxsize=1)
def _identifier() -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    identifier.set_languages(list(LANGUAGES))
    # The model of all 97 languages is kept only to restrict it again, which nothing here does: let it
    # go, and the process holds 68 MB for the language model instead of 96.
    identifier._full_model = None
    return identifier


def load() -> None:
    """Load the language identifier now (about 0.6 s of CPU and 68 MB, once per process), at start-up, so that
    no write or search waits for it. The segmenters load when a first Chinese (0.15 s) or Japanese
    text comes."""
    _identifier()


def detect(text: str) -> str:
    """The language of `text`, one of `LANGUAGES` (Japanese wherever there is kana: py3langid can take
    a kanji-heavy Japanese sentence for Chinese)."""
    if _KANA.search(text):
        return "ja"
    if not _LETTER.search(text):
        return DEFAULT_LANGUAGE
    language: str = _identifier().classify(text)[0]
    return language


def config_of(language: str) -> str:
    return SNOWBALL.get(language, "simple")


@lru_cache(maxsize=1)
def _japanese() -> Any:
    import tinysegmenter

    return tinysegmenter.TinySegmenter()


def _word_runs(text: str) -> list[str]:
    """The runs of letters, digits and combining marks of `text` (a vowel sign of Thai or Devanagari is a
    mark, not a letter: `\\w` would cut the word at it)."""
    runs: list[str] = []
    current: list[str] = []
    for char in text:
        if char != "_" and unicodedata.category(char)[0] in "LNM":
            current.append(char)
        elif current:
            runs.append("".join(current))
            current = []
    if current:
        runs.append("".join(current))
    return runs


def _bigrams(run: str) -> list[str]:
    return [run] if len(run) < 2 else [run[i : i + 2] for i in range(len(run) - 1)]


def words(text: str, language: str) -> list[str]:
    """`text` cut into words: by the language's segmenter, else at spaces, with runs of unspaced
    scripts as character pairs (lower case, letters and digits only)."""
    text = unicodedata.normalize("NFKC", text)
    if language == "zh":
        import rjieba

        tokens: list[str] = rjieba.cut_for_search(text)
    elif language == "ja":
        tokens = _japanese().tokenize(text)
    else:
        tokens = text.split()
    out: list[str] = []
    for token in tokens:
        for word in _word_runs(token.lower()):
            if language in SEGMENTED or not _UNSPACED.search(word):
                out.append(word)
                continue
            at = 0
            for run in _UNSPACED.finditer(word):
                out.extend(w for w in [word[at : run.start()]] if w)
                out.extend(_bigrams(run.group()))
                at = run.end()
            out.extend(w for w in [word[at:]] if w)
    return out


def analyze(text: str, language: str | None = None) -> Analyzed:
    """A memory's lexical form (its language detected unless given)."""
    language = language or detect(text)
    config = config_of(language)
    if language in SEGMENTED or _UNSPACED.search(text):
        return Analyzed(language, config, " ".join(words(text, language)))
    return Analyzed(language, config, text)  # Postgres's own parser splits spaced scripts


@lru_cache(maxsize=1024)
def likely_languages(text: str) -> tuple[str, ...]:
    """The languages a query is read in, most likely first: its language where that is sure, else each
    likely one until they add up to `_SURE` (at most `_MAX_READINGS`). Kept for the query's words and
    its time phrase alike: a search ranks a text's languages once."""
    if _KANA.search(text):
        ranked = [("ja", 1.0)]
    elif not _LETTER.search(text):
        ranked = [(DEFAULT_LANGUAGE, 1.0)]
    else:
        ranked = _identifier().rank(text)
    readings: list[str] = []
    total = 0.0
    for language, probability in ranked[:_MAX_READINGS]:
        readings.append(language)
        total += probability
        if total >= _SURE:
            break
    return tuple(readings)


def query_words(text: str) -> tuple[list[str], list[str]]:
    """A query's text search configurations and its content words for BM25 (each once, at most 64).

    The configurations: its language's, or, where that is not sure (a name, a number, a few words: a
    short text says little), each likely language's; then English (the default, and what a bank held
    before its memories had a language) and `simple` (unstemmed: languages without a configuration,
    names and numbers in any); each lexeme met under any of them is looked for. The words: the text's,
    segmented like a memory in its language, less the words that name the user and the segmented
    languages' function words. Postgres then drops each configuration's stop words and stems the rest.
    """
    readings = likely_languages(text)
    configs = [config_of(language) for language in readings]
    found = [w for w in words(text, readings[0]) if w not in USER_WORDS and w not in _SEGMENTED_STOPWORDS]
    return list(dict.fromkeys([*configs, "english", "simple"])), list(dict.fromkeys(found))[:MAX_QUERY_WORDS]
