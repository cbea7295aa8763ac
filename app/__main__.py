"""`python -m app ...` is the `memstore` command (used by `memstore up` to start its children)."""

from __future__ import annotations

from app.cli import main

main()
