"""mem0ai 1.0.11's `Memory.add` (classic: fact extraction, then the update call), its own methods
compiled from its `memory/main.py`, with its own OpenAI client; the vector store and embedder are
stand-ins holding the scenario's memories.

Scenario keys: base_url, model, memory_at (its date is written where Mem0 writes the day its prompts
module was imported, the difference Memstore keeps), messages, existing ([{memory_id, content}]),
agent_id (optional).
"""

from __future__ import annotations

import concurrent.futures
import copy
import datetime as dt
import hashlib
import json
import logging
import os
import sys
import typing
import uuid
from types import SimpleNamespace
from typing import Any

from app.writers import references
from tests.support.references._load import functions, load_modules


def main(scenario: dict[str, Any]) -> None:
    root = references.folder(references.MEM0_CLASSIC)
    os.environ.pop("OPENROUTER_API_KEY", None)
    modules = load_modules(
        root,
        "mem0",
        [
            "mem0.configs.prompts",
            "mem0.memory.utils",
            "mem0.exceptions",
            "mem0.configs.enums",
            "mem0.llms.openai",
            "mem0.configs.llms.openai",
        ],
    )
    prompts = modules["mem0.configs.prompts"]
    today, memory_day = dt.datetime.now().strftime("%Y-%m-%d"), scenario["memory_at"][:10]
    namespace: dict[str, Any] = {
        "__name__": "mem0.memory.main",
        "json": json,
        "os": os,
        "uuid": uuid,
        "hashlib": hashlib,
        "concurrent": concurrent,
        "deepcopy": copy.deepcopy,
        "datetime": dt.datetime,
        "timezone": dt.timezone,
        "logger": logging.getLogger("mem0.memory.main"),
        "Any": typing.Any,
        "Dict": typing.Dict,  # noqa: UP006
        "List": typing.List,  # noqa: UP006
        "Optional": typing.Optional,
        "Union": typing.Union,
        "MEM0_TELEMETRY": False,
        "capture_event": lambda *a, **k: None,
        "Mem0ValidationError": modules["mem0.exceptions"].ValidationError,
        "MemoryType": modules["mem0.configs.enums"].MemoryType,
    }
    for name in ("mem0.configs.prompts", "mem0.memory.utils"):
        namespace.update({k: v for k, v in vars(modules[name]).items() if not k.startswith("__")})
    for holder in (vars(prompts), vars(modules["mem0.memory.utils"]), namespace):
        for constant in ("USER_MEMORY_EXTRACTION_PROMPT", "AGENT_MEMORY_EXTRACTION_PROMPT"):
            if constant in holder:
                holder[constant] = holder[constant].replace(today, memory_day)
    compiled = functions(
        root / "mem0" / "memory" / "main.py",
        ["_build_filters_and_metadata", "_normalize_iso_timestamp_to_utc"],
        "Memory",
        ["add", "_add_to_vector_store", "_add_to_graph", "_should_use_agent_memory_extraction"],
        namespace,
    )
    memory = type(
        "Memory", (), {k.split(".", 1)[1]: f for k, f in compiled.items() if k.startswith("Memory.")}
    )()
    rows = [
        SimpleNamespace(id=f"uuid-{m['memory_id']}", payload={"data": m["content"]}, score=1.0)
        for m in scenario["existing"]
    ]
    memory.config = SimpleNamespace(
        custom_fact_extraction_prompt=None, custom_update_memory_prompt=None, llm=SimpleNamespace(config={})
    )
    llm_module, config_module = modules["mem0.llms.openai"], modules["mem0.configs.llms.openai"]
    memory.llm = llm_module.OpenAILLM(
        config_module.OpenAIConfig(
            model=scenario["model"], api_key="reference", openai_base_url=scenario["base_url"]
        )
    )
    memory.enable_graph = False
    memory.api_version = "v1.1"
    memory.vector_store = SimpleNamespace(
        search=lambda query, vectors, limit=5, filters=None: rows[:limit],
        get=lambda vector_id: None,
        update=lambda *a, **k: None,
    )
    memory.embedding_model = SimpleNamespace(embed=lambda text, memory_action=None: [0.0])
    memory._create_memory = lambda data, embeddings, metadata=None: str(uuid.uuid4())
    memory._update_memory = lambda *a, **k: None
    memory._delete_memory = lambda *a, **k: None
    messages = [
        {"role": m["role"], "content": m["content"], **({"name": m["name"]} if m.get("name") else {})}
        for m in scenario["messages"]
    ]
    memory.add(messages, user_id="user", agent_id=scenario.get("agent_id"))


if __name__ == "__main__":
    main(json.load(sys.stdin))
