"""A process's embedders by name: each built once, when first asked for, the deployment's shared."""

from __future__ import annotations

from app.config import Settings
from app.embeddings import Embedders, HashingEmbedder, embedder_from_settings


async def test_each_embedder_is_built_once_when_first_asked_for() -> None:
    settings = Settings(embedder="hashing", embedder_base_url="http://127.0.0.1:9/v1")
    default = embedder_from_settings(settings)
    embedders = Embedders(settings, default=default)
    assert embedders.loaded() == ("hashing",)
    assert embedders.get(None) is default
    assert embedders.get("hashing") is default
    served = embedders.get("openai")  # built, not called: no request is made until a text is embedded
    assert embedders.get("openai") is served
    assert embedders.loaded() == ("hashing", "openai")
    assert served.name != default.name
    await embedders.aclose()


async def test_without_a_default_the_deployments_is_built_on_first_use() -> None:
    embedders = Embedders(Settings(embedder="hashing"))
    assert embedders.loaded() == ()
    [vector] = await embedders.default.embed(["The user lives in Oslo."])
    assert vector == HashingEmbedder(384).embed_one("The user lives in Oslo.")
    assert embedders.loaded() == ("hashing",)
    await embedders.aclose()
