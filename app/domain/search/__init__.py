"""Search over memories: exact per scope, HNSW across scopes, lexical + vector fused, as of a time."""
