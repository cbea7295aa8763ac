"""Bounded contexts, each with controllers (HTTP), services (rules), repositories (SQL) and schemas."""
