"""The MemOS protocol, as `MemoryOS` 2.0.33's MemReader speaks it for a chat (its server's default
`multimodal_struct` reader): one call per conversation window.

The chunk's messages are one scene, as one `/product/add` request is in MemOS. They are rendered as
`role: [chat_time]: content` lines (`chat_time` is the message's `created_at`; one without takes the
first time of the scene, or now) and cut into windows of 1,024 estimated tokens, each new window
carrying up to 200 tokens of the one before, unmarked, as MemOS cuts them. Each window goes to the
model as one user message: MemOS's reader prompt with the window in place of `${conversation}` (its
Chinese prompt when the window's first message is Chinese, by MemOS's own test), no custom tags, its
worked examples kept. It answers `{"memory list": [{"key", "memory_type", "value", "tags"}],
"summary"}`; each item becomes an ADD of its `value` with its tags, `memory_type: key` as the reason.
MemOS has no reconcile step: a memory already known is caught by the near-duplicate guard. What
differs from MemOS is listed in docs/writers.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from app.writers import references
from app.writers.base import Message, Op, OpKind, WriteRequest
from app.writers.profiles.base import (
    ChatMessages,
    ModelSession,
    ParseError,
    ProfileResult,
    PromptSet,
    expect_list,
)

REFERENCE = references.MEMOS
PROMPTS_FILE = "memos/templates/mem_reader_prompts.py"
MAX_TOKENS = 8000  # MEMRADER_MAX_TOKENS
WINDOW_TOKENS = 1024  # chat_window_max_tokens
OVERLAP_TOKENS = 200
ROLES = ("user", "assistant", "system")
# TreeNodeTextualMemoryMetadata.memory_type: an item of any other type is dropped, as MemOS drops it.
MEMORY_TYPES = frozenset(
    (
        "WorkingMemory",
        "LongTermMemory",
        "UserMemory",
        "OuterMemory",
        "ToolSchemaMemory",
        "ToolTrajectoryMemory",
        "RawFileMemory",
        "SkillMemory",
        "PreferenceMemory",
        "Context",
    )
)
_HAN = re.compile(r"[\u4e00-\u9fff]")
_LANG_HAN = re.compile(
    "[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
    "\U0002b820-\U0002ceaf\uf900-\ufaff]"
)
_LANG_NOISE = (
    (re.compile(r"\b(user|assistant|query|answer)\s*:", re.IGNORECASE), ""),
    (
        re.compile(
            r"\[\s*\d{1,2}:\d{2}\s*(?:AM|PM)\s+on\s+\d{2}\s+[A-Za-z]+\s*,\s*\d{4}\s*\]", re.IGNORECASE
        ),
        "",
    ),
    (re.compile(r"\[[\d\-:\s]+\]"), ""),
    (re.compile(r'https?://[^\s<>"{}|\\^`\[\]]+'), ""),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE), " "),
    (re.compile(r'(?i)\b[a-z_]*id\b\s*[:=]\s*(".*?"|\'.*?\'|[a-z0-9_\-]+)'), " "),
    (re.compile(r'(?i)\b[a-z_]*_id\b\s*[:=]\s*(".*?"|\'.*?\'|[a-z0-9_\-]+)'), " "),
    (
        re.compile(r"\b(text|type|image_url|imageurl|url|file|file_id|image_id|file_data)\b", re.IGNORECASE),
        "",
    ),
)


# Sent only when a writer's response_format asks for a schema (a small model that needs it).
_STRING = {"type": "string"}
MEMORY_LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "memory list": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "key": _STRING,
                    "memory_type": {"type": "string", "enum": ["UserMemory", "LongTermMemory"]},
                    "value": _STRING,
                    "tags": {"type": "array", "items": _STRING},
                },
                "required": ["key", "memory_type", "value", "tags"],
            },
        },
        "summary": _STRING,
    },
    "required": ["memory list", "summary"],
}


def detect_lang(text: str) -> str:
    """MemOS's language test: `zh` when more than 30 % of the letters left, once role labels,
    times, links and ids are taken out, are Chinese."""
    cleaned = text
    for pattern, replacement in _LANG_NOISE:
        cleaned = pattern.sub(replacement, cleaned)
    letters = re.sub(r"[\s\d\W]", "", cleaned)
    return "zh" if letters and len(_LANG_HAN.findall(cleaned)) / len(letters) > 0.3 else "en"


def count_tokens(text: str) -> int:
    """MemOS's estimate without tiktoken (not among its dependencies): a token per Chinese
    character and per four other characters."""
    if not text:
        return 0
    han = len(_HAN.findall(text))
    return han + max(1, (len(text) - han) // 4)


@dataclass(frozen=True)
class Window:
    text: str
    first: str  # the content of its first message, which decides its language


def windows(messages: Sequence[Message], now: datetime) -> list[Window]:
    """The conversation cut as MemOS cuts one scene: lines added while the window stays within
    1,024 tokens; a full window is sent and the next starts with the shortest tail of it that is
    at most 200 tokens."""
    chat = [m for m in messages if m.role in ROLES and m.content]
    times = [m.created_at for m in chat if m.created_at is not None]
    default = times[0].isoformat() if times else now.strftime("%I:%M %p on %d %B, %Y")
    found: list[Window] = []
    lines: list[str] = []
    firsts: list[str] = []
    for message in chat:
        when = message.created_at.isoformat() if message.created_at else default
        line = f"{message.role}: [{when}]: {message.content}\n"
        if lines and count_tokens("".join(lines) + line) > WINDOW_TOKENS:
            found.append(Window("".join(lines), firsts[0]))
            while lines and count_tokens("".join(lines)) > OVERLAP_TOKENS:
                lines.pop(0)
                firsts.pop(0)
        lines.append(line)
        firsts.append(message.content)
    if lines:
        found.append(Window("".join(lines), firsts[0]))
    return found


@dataclass(frozen=True)
class MemoryItem:
    key: str
    memory_type: str
    value: str
    tags: tuple[str, ...]


def parse_memory_list(value: Any) -> list[MemoryItem]:
    if not isinstance(value, dict):
        msg = 'expected a JSON object with a "memory list"'
        raise ParseError(msg)
    found = []
    for item in expect_list(value, "memory list") if "memory list" in value else []:
        if not isinstance(item, dict) or not isinstance(item.get("value", ""), str):
            continue
        memory_type = str(item.get("memory_type", "LongTermMemory"))
        memory_type = memory_type.replace("长期记忆", "LongTermMemory").replace("用户记忆", "UserMemory")
        memory_type = memory_type.replace("pref", "UserMemory")
        tags = item.get("tags", [])
        if (
            memory_type not in MEMORY_TYPES
            or not isinstance(tags, list)
            or not all(isinstance(t, str) for t in tags)
        ):
            continue  # MemOS's item model refuses it
        if item.get("value", "").strip():
            found.append(
                MemoryItem(
                    str(item.get("key") or "").strip()[:100],
                    memory_type,
                    item["value"].strip(),
                    tuple(t.strip()[:50] for t in tags if t.strip())[:10],
                )
            )
    return found


class MemosProfile:
    name = "memos"
    context_messages = 0  # a MemOS add request is a scene of its own: earlier adds are not shown

    def __init__(self, prompts_dir: Path | None = None) -> None:
        names = ("SIMPLE_STRUCT_MEM_READER_PROMPT", "SIMPLE_STRUCT_MEM_READER_PROMPT_ZH")
        self.prompts = PromptSet(
            self.name, references.constants(REFERENCE, PROMPTS_FILE, *names), prompts_dir
        )

    def messages(self, window: Window) -> ChatMessages:
        suffix = "_ZH" if detect_lang(window.first) == "zh" else ""
        prompt = self.prompts[f"SIMPLE_STRUCT_MEM_READER_PROMPT{suffix}"].replace(
            "${conversation}", window.text
        )
        return [{"role": "user", "content": prompt.replace("${custom_tags_prompt}", "")}]

    async def write(self, request: WriteRequest, model: ModelSession) -> ProfileResult:
        items: list[MemoryItem] = []
        for index, window in enumerate(windows(request.messages, request.now)):
            step = "extract" if index == 0 else f"extract.{index + 1}"
            items += await model.ask(
                step,
                self.messages(window),
                parse=parse_memory_list,
                max_tokens=MAX_TOKENS,
                schema=MEMORY_LIST_SCHEMA,
            )
        if not items:
            return ProfileResult([Op(OpKind.NOOP, reason="nothing worth remembering")])
        return ProfileResult([to_op(item) for item in items])


def to_op(item: MemoryItem) -> Op:
    reason = f"{item.memory_type}: {item.key}" if item.key else item.memory_type
    return Op(OpKind.ADD, item.value, tags=item.tags, reason=reason)
