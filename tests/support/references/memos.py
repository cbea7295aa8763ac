"""MemoryOS 2.0.33's MemReader on a chat, as its server runs it (the `multimodal_struct` reader, its
reader LLM configured as `APIConfig.get_memreader_config` configures it), with its own OpenAI client.
`memos/__init__` is skipped (it starts the whole MemOS stack); its logging module, which configures
file handlers, is a plain one here; third-party modules the chat path never uses are stand-ins.

Scenario keys: base_url, model, now, messages (role, content, created_at -> chat_time).
"""

from __future__ import annotations

import json
import logging
import sys
import types
from typing import Any

from app.writers import references
from tests.support.references._load import MissingModuleStubs


def main(scenario: dict[str, Any]) -> None:
    root = references.folder(references.MEMOS) / "memos"
    sys.meta_path.append(MissingModuleStubs(root, never={"tiktoken"}))  # MemOS counts tokens without it
    package = types.ModuleType("memos")
    package.__path__ = [str(root)]
    sys.modules["memos"] = package
    log = types.ModuleType("memos.log")
    log.get_logger = lambda name=None: logging.getLogger(name or "memos")  # type: ignore[attr-defined]
    log.text_hash = lambda text: ""  # type: ignore[attr-defined]
    log.__getattr__ = lambda name: lambda *a, **k: None  # type: ignore[attr-defined]  (log helpers)
    sys.modules["memos.log"] = log

    from memos.configs.llm import LLMConfigFactory
    from memos.llms.factory import LLMFactory
    from memos.mem_reader.multi_modal_struct import MultiModalStructMemReader
    from memos.mem_reader.read_multi_modal import MultiModalParser
    from memos.mem_reader.utils import count_tokens_text

    llm = LLMFactory.from_config(
        LLMConfigFactory.model_validate(
            {
                "backend": "openai",
                "config": {
                    "model_name_or_path": scenario["model"],
                    "temperature": 0.6,
                    "max_tokens": 8000,
                    "top_p": 0.95,
                    "top_k": 20,
                    "api_key": "reference",
                    "api_base": scenario["base_url"],
                    "remove_think_prefix": True,
                },
            }
        )
    )
    embedder = types.SimpleNamespace(embed=lambda texts: [[0.0] for _ in texts])
    reader = object.__new__(MultiModalStructMemReader)
    reader.config = types.SimpleNamespace(remove_prompt_example=False)
    reader.llm = reader.general_llm = reader.preference_extractor_llm = reader.image_parser_llm = llm
    reader.embedder = embedder
    reader.chat_window_max_tokens = 1024
    reader._count_tokens = count_tokens_text
    reader.memory_version_switch = "off"
    reader.save_rawfile = False
    reader.searcher = reader.graph_db = reader.oss_config = reader.skills_dir_config = None
    reader.document_parser_llm = reader.qwen_llm = None
    reader.multi_modal_parser = MultiModalParser(
        embedder=embedder,
        llm=llm,
        image_parser_llm=llm,
        document_parser_llm=None,
        parser=None,
        direct_markdown_hostnames=None,
    )
    scene = [
        {
            "role": m["role"],
            "content": m["content"],
            **({"chat_time": m["created_at"]} if m.get("created_at") else {}),
        }
        for m in scenario["messages"]
    ]
    import freezegun

    with freezegun.freeze_time(scenario["now"]):  # a message without a time is given now's
        reader.get_memory([scene], type="chat", info={"user_id": "user", "session_id": "s"}, mode="fine")


if __name__ == "__main__":
    main(json.load(sys.stdin))
