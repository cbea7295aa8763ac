"""mem0ai 2.2.1's `Memory.add` (the additive protocol: one extraction call), its own methods compiled
from its `memory/main.py`, with its own OpenAI client and its own SQLite message history (holding the
scenario's earlier messages); the vector store and embedder are stand-ins holding its memories.

Scenario keys: base_url, model, now (its date is the current date Mem0 writes), messages, context
(earlier chunks, oldest first), existing ([{memory_id, content}]).
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import logging
import os
import sys
import time
import typing
import uuid
from types import SimpleNamespace
from typing import Any

from app.writers import references
from tests.support.references._load import functions, load_modules


def main(scenario: dict[str, Any]) -> None:
    root = references.folder(references.MEM0_ADDITIVE)
    os.environ.pop("OPENROUTER_API_KEY", None)
    modules = load_modules(
        root,
        "mem0",
        [
            "mem0.configs.prompts",
            "mem0.memory.utils",
            "mem0.exceptions",
            "mem0.configs.enums",
            "mem0.memory.storage",
            "mem0.llms.openai",
            "mem0.configs.llms.openai",
        ],
    )
    now = dt.datetime.fromisoformat(scenario["now"])

    class Today(dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return now.replace(tzinfo=tz)

    vars(modules["mem0.configs.prompts"])["datetime"] = Today
    errors = modules["mem0.exceptions"]
    namespace: dict[str, Any] = {
        "__name__": "mem0.memory.main",
        "json": json,
        "os": os,
        "uuid": uuid,
        "hashlib": hashlib,
        "time": time,
        "deepcopy": copy.deepcopy,
        "datetime": dt.datetime,
        "date": dt.date,
        "timezone": dt.timezone,
        "logger": logging.getLogger("mem0.memory.main"),
        "Any": typing.Any,
        "Dict": typing.Dict,  # noqa: UP006
        "Optional": typing.Optional,
        "MEM0_TELEMETRY": False,
        "capture_event": lambda *a, **k: None,
        "Mem0ValidationError": errors.ValidationError,
        "LLMError": errors.LLMError,
        "VectorStoreError": errors.VectorStoreError,
        "MemoryType": modules["mem0.configs.enums"].MemoryType,
        "ENTITY_PARAMS": frozenset({"user_id", "agent_id", "run_id"}),
        "_IDENTITY_KEYS": frozenset({"user_id", "agent_id", "run_id", "actor_id"}),
        # after the model's answer: spaCy lemmas and entities, which the request does not depend on
        "lemmatize_for_bm25": lambda text: text,
        "extract_entities_batch": lambda texts, batch_size=32: [[] for _ in texts],
        # notices, which import telemetry
        "detect_temporal_usage_from_metadata": lambda metadata: None,
        "detect_scale_threshold_from_add_result": lambda self, result: None,
        "display_temporal_usage_notice": lambda *a, **k: None,
        "display_scale_threshold_notice": lambda *a, **k: None,
        "display_first_run_notice": lambda *a, **k: None,
        "get_temporal_feature_error_message": lambda *a: "",
    }
    for name in ("mem0.configs.prompts", "mem0.memory.utils"):
        namespace.update({k: v for k, v in vars(modules[name]).items() if not k.startswith("__")})
    compiled = functions(
        root / "mem0" / "memory" / "main.py",
        [
            "_strip_identity_keys",
            "_validate_and_trim_entity_id",
            "_build_filters_and_metadata",
            "_normalize_expiration_date",
            "_escape_scope_value",
            "_build_session_scope",
            "_vector_store_list_rows",
        ],
        "Memory",
        ["add", "_add_to_vector_store", "_normalize_entity_text", "_existing_entities_by_text"],
        namespace,
    )
    methods = {k.split(".", 1)[1]: f for k, f in compiled.items() if k.startswith("Memory.")}
    methods["_normalize_entity_text"] = staticmethod(methods["_normalize_entity_text"])
    memory = type("Memory", (), methods)()
    rows = [
        SimpleNamespace(id=f"uuid-{m['memory_id']}", payload={"data": m["content"], "hash": ""}, score=1.0)
        for m in scenario["existing"]
    ]
    memory.config = SimpleNamespace(llm=SimpleNamespace(config={}))
    memory.custom_instructions = None
    llm_module, config_module = modules["mem0.llms.openai"], modules["mem0.configs.llms.openai"]
    memory.llm = llm_module.OpenAILLM(
        config_module.OpenAIConfig(
            model=scenario["model"], api_key="reference", openai_base_url=scenario["base_url"]
        )
    )
    memory.api_version = "v1.1"
    store = SimpleNamespace(
        search=lambda query, vectors, top_k=5, filters=None: rows[:top_k],
        search_batch=lambda queries, vectors_list, top_k=1, filters=None: [[] for _ in queries],
        insert=lambda *a, **k: None,
        list=lambda filters=None, top_k=100: [[]],
        update=lambda *a, **k: None,
    )
    memory.vector_store = store
    memory.entity_store = store
    memory.embedding_model = SimpleNamespace(
        embed=lambda text, memory_action=None: [0.0],
        embed_batch=lambda texts, memory_action=None: [[0.0] for _ in texts],
    )
    memory.db = modules["mem0.memory.storage"].SQLiteManager(":memory:")

    def plain(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"role": m["role"], "content": m["content"], **({"name": m["name"]} if m.get("name") else {})}
            for m in items
        ]

    scope = compiled["_build_session_scope"]({"user_id": "user"})
    for chunk in scenario["context"]:  # the earlier add() calls' messages, as add() saves them
        memory.db.save_messages(plain(chunk), scope)
    memory.add(plain(scenario["messages"]), user_id="user")


if __name__ == "__main__":
    main(json.load(sys.stdin))
