"""Alembic migrations; `app.db.migrate` runs them programmatically."""
