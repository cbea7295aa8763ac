"""Answering (`POST /v1/answer`): the read model."""

from pydantic import BaseModel, Field


class ReaderSettings(BaseModel):
    reader_base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible endpoint of the model that answers from memories; unset: /v1/answer "
        "answers 501.",
    )
    reader_model: str | None = Field(default=None, description="Model name sent to the reader endpoint.")
    reader_api_key: str | None = Field(default=None, description="Bearer key for the reader endpoint.")
    reader_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest one request to the reader model may take."
    )
    reader_max_tokens: int = Field(default=512, ge=1, description="max_tokens of each reader request.")
