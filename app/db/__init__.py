"""Database plumbing: metadata, engine and sessions, and the ORM models (one file per table)."""
