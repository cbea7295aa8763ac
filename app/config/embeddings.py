"""The embedder that vectors memories and queries."""

from pydantic import BaseModel, Field


class EmbedderSettings(BaseModel):
    embedder: str = Field(
        default="onnx",
        description="Embedder name: onnx (all-MiniLM-L6-v2 in-process, semantic, English), e5 "
        "(multilingual-e5-small in-process, semantic, about 100 languages), hashing (lexical, "
        "dependency-free), openai (an /v1/embeddings endpoint), local (sentence-transformers extra).",
    )
    tenant_embedders: list[str] = Field(
        default=["onnx", "e5"],
        description="The embedders a tenant may choose for itself (`embedder` in PATCH "
        "/v1/admin/settings), besides the deployment's, as JSON: each process loads one when a tenant that "
        "uses it first needs it. Each must make vectors of `embedding_dim`.",
    )
    embedder_switch_settle_s: float = Field(
        default=35.0,
        ge=0,
        description="How long a tenant's move to another embedder waits before it re-embeds, so that every "
        "process has read it (they keep tenants' options up to 30 s): lower only where no process runs "
        "with an older copy.",
    )
    embedding_dim: int = Field(
        default=384, description="Vector dimension of memories; fixed by the initial migration."
    )
    embedder_base_url: str = Field(
        default="http://127.0.0.1:8002/v1", description="OpenAI-compatible endpoint of the openai embedder."
    )
    embedder_model: str = Field(
        default="all-MiniLM-L6-v2",
        description="Model name sent to the openai embedder, or the onnx/local embedder's model (the "
        "packaged all-MiniLM-L6-v2, or a directory).",
    )
    embedder_threads: int = Field(
        default=0,
        ge=0,
        description="Threads of one onnx or e5 embedding run (0: one per core in the API, where a search "
        "waits for it; one in a worker, whose jobs' texts queue for it).",
    )
    embedder_api_key: str | None = Field(default=None, description="Bearer key for the embedder endpoint.")
    embedder_cache_size: int = Field(
        default=4096,
        ge=0,
        description="Texts whose vectors a process keeps, so a text is not embedded twice (0: no cache).",
    )
    embedder_batch_size: int = Field(default=64, description="Texts per embedding request.", ge=1)
    embedder_timeout_s: float = Field(default=10.0, description="Longest one embedding request may take.")
    embedder_max_retries: int = Field(
        default=3, description="Retries of one embedding request on timeouts, 429 and 5xx (with backoff)."
    )
