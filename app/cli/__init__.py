"""The `memstore` command: `main` is the entry point; each module adds one group of commands."""

from app.cli.main import main

__all__ = ["main"]
