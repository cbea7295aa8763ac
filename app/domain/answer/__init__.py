"""Answering a question from a user's memories: Memstore's own search, then a read model."""
