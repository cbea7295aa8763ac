"""The append-only, per-tenant hash-chained audit log."""
