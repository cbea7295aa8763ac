"""Shared plumbing (logging, errors, security, the embedded stack). Imports nothing from `app.domain`."""
