"""Hand-written harder pairs per language, appended by bench/pairs/make_pairs.py: restatements in other
words, distinct facts that share nearly every word, updates the model must infer, and unrelated facts
that share their words."""

from __future__ import annotations


def _dup(a: str, b: str, label: bool, kind: str) -> dict[str, object]:
    return {"set": "duplicate", "a": a, "b": b, "duplicate": label, "kind": kind, "hard": True}


def _rel(a: str, b: str, label: bool, kind: str) -> dict[str, object]:
    return {"set": "related", "a": a, "b": b, "related": label, "kind": kind, "hard": True}


HARD: dict[str, list[dict[str, object]]] = {
    "en": [
        _dup("The user is vegetarian.", "The user does not eat meat.", True, "restatement"),
        _dup(
            "The user works from home on Fridays.",
            "On Fridays the user works from home.",
            True,
            "restatement",
        ),
        _dup("The user's son is called Tom.", "The user's daughter is called Tom.", False, "kin"),
        _dup("The user runs 5 km every morning.", "The user runs 10 km every morning.", False, "number"),
        _dup("The user prefers window seats.", "The user prefers aisle seats.", False, "preference"),
        _dup("The user takes the bus to work.", "The user takes the train to work.", False, "content"),
        _rel(
            "The user became vegetarian.", "The user's favourite dish is beef bourguignon.", True, "inferred"
        ),
        _rel("The user quit smoking last month.", "The user smokes a pack a day.", True, "inferred"),
        _rel("The user sold their bike.", "The user cycles to work every day.", True, "inferred"),
        _rel("The user's cat died.", "The user's daughter is called Mia.", False, "other topic"),
        _rel("The user lives near the beach.", "The user is allergic to penicillin.", False, "other topic"),
    ],
    "de": [
        _dup("Der Nutzer ist Vegetarier.", "Der Nutzer isst kein Fleisch.", True, "restatement"),
        _dup(
            "Der Nutzer arbeitet freitags im Homeoffice.",
            "Freitags arbeitet der Nutzer im Homeoffice.",
            True,
            "restatement",
        ),
        _dup("Der Sohn des Nutzers heißt Tom.", "Die Tochter des Nutzers heißt Tom.", False, "kin"),
        _dup("Der Nutzer läuft jeden Morgen 5 km.", "Der Nutzer läuft jeden Morgen 10 km.", False, "number"),
        _dup(
            "Der Nutzer sitzt im Flugzeug am liebsten am Fenster.",
            "Der Nutzer sitzt im Flugzeug am liebsten am Gang.",
            False,
            "preference",
        ),
        _dup(
            "Der Nutzer fährt mit dem Bus zur Arbeit.",
            "Der Nutzer fährt mit dem Zug zur Arbeit.",
            False,
            "content",
        ),
        _rel(
            "Der Nutzer ist jetzt Vegetarier.",
            "Das Lieblingsgericht des Nutzers ist Rinderroulade.",
            True,
            "inferred",
        ),
        _rel(
            "Der Nutzer hat letzten Monat mit dem Rauchen aufgehört.",
            "Der Nutzer raucht eine Schachtel am Tag.",
            True,
            "inferred",
        ),
        _rel(
            "Der Nutzer hat sein Fahrrad verkauft.",
            "Der Nutzer fährt jeden Tag mit dem Rad zur Arbeit.",
            True,
            "inferred",
        ),
        _rel(
            "Die Katze des Nutzers ist gestorben.", "Die Tochter des Nutzers heißt Mia.", False, "other topic"
        ),
        _rel(
            "Der Nutzer wohnt in der Nähe des Strandes.",
            "Der Nutzer ist allergisch gegen Penicillin.",
            False,
            "other topic",
        ),
    ],
    "es": [
        _dup("El usuario es vegetariano.", "El usuario no come carne.", True, "restatement"),
        _dup(
            "El usuario teletrabaja los viernes.",
            "Los viernes el usuario trabaja desde casa.",
            True,
            "restatement",
        ),
        _dup("El hijo del usuario se llama Tomás.", "La hija del usuario se llama Tomás.", False, "kin"),
        _dup("El usuario corre 5 km cada mañana.", "El usuario corre 10 km cada mañana.", False, "number"),
        _dup(
            "El usuario prefiere el asiento de ventanilla.",
            "El usuario prefiere el asiento de pasillo.",
            False,
            "preference",
        ),
        _dup("El usuario va al trabajo en autobús.", "El usuario va al trabajo en tren.", False, "content"),
        _rel(
            "El usuario se ha hecho vegetariano.",
            "El plato favorito del usuario es el cochinillo asado.",
            True,
            "inferred",
        ),
        _rel(
            "El usuario dejó de fumar el mes pasado.", "El usuario fuma un paquete al día.", True, "inferred"
        ),
        _rel(
            "El usuario vendió su bicicleta.",
            "El usuario va en bici al trabajo todos los días.",
            True,
            "inferred",
        ),
        _rel("El gato del usuario murió.", "La hija del usuario se llama Mía.", False, "other topic"),
        _rel(
            "El usuario vive cerca de la playa.",
            "El usuario es alérgico a la penicilina.",
            False,
            "other topic",
        ),
    ],
    "zh": [
        _dup("用户是素食者。", "用户不吃肉。", True, "restatement"),
        _dup("用户每周五在家办公。", "每个星期五用户都在家上班。", True, "restatement"),
        _dup("用户的儿子叫小明。", "用户的女儿叫小明。", False, "kin"),
        _dup("用户每天早上跑5公里。", "用户每天早上跑10公里。", False, "number"),
        _dup("用户坐飞机喜欢靠窗的座位。", "用户坐飞机喜欢靠过道的座位。", False, "preference"),
        _dup("用户坐公交车上班。", "用户坐地铁上班。", False, "content"),
        _rel("用户开始吃素了。", "用户最喜欢的菜是红烧肉。", True, "inferred"),
        _rel("用户上个月戒烟了。", "用户每天抽一包烟。", True, "inferred"),
        _rel("用户把自行车卖了。", "用户每天骑车上班。", True, "inferred"),
        _rel("用户的猫去世了。", "用户的女儿叫小美。", False, "other topic"),
        _rel("用户住在海边。", "用户对青霉素过敏。", False, "other topic"),
    ],
    "ja": [
        _dup("ユーザーはベジタリアンだ。", "ユーザーは肉を食べない。", True, "restatement"),
        _dup(
            "ユーザーは金曜日に在宅勤務をしている。",
            "金曜日、ユーザーは家で仕事をしている。",
            True,
            "restatement",
        ),
        _dup("ユーザーの息子の名前は翔太だ。", "ユーザーの娘の名前は翔太だ。", False, "kin"),
        _dup("ユーザーは毎朝5キロ走る。", "ユーザーは毎朝10キロ走る。", False, "number"),
        _dup(
            "ユーザーは飛行機では窓側の席が好きだ。",
            "ユーザーは飛行機では通路側の席が好きだ。",
            False,
            "preference",
        ),
        _dup("ユーザーはバスで通勤している。", "ユーザーは電車で通勤している。", False, "content"),
        _rel("ユーザーはベジタリアンになった。", "ユーザーの好物は牛丼だ。", True, "inferred"),
        _rel("ユーザーは先月タバコをやめた。", "ユーザーは一日に一箱タバコを吸う。", True, "inferred"),
        _rel("ユーザーは自転車を売った。", "ユーザーは毎日自転車で通勤している。", True, "inferred"),
        _rel("ユーザーの猫が死んだ。", "ユーザーの娘の名前は美咲だ。", False, "other topic"),
        _rel(
            "ユーザーは海の近くに住んでいる。", "ユーザーはペニシリンアレルギーがある。", False, "other topic"
        ),
    ],
}
