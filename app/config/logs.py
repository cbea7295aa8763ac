"""Logging."""

from typing import Literal

from pydantic import BaseModel, Field

LogFormat = Literal["auto", "console", "json"]


class LogSettings(BaseModel):
    log_level: str = Field(default="INFO", description="Minimum log level.")
    log_format: LogFormat = Field(
        default="auto", description="console (readable), json (production) or auto (json unless a TTY)."
    )
