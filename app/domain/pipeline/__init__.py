"""The worker side of the core loop: per-scope ordered processing of chunks, and the sweeper."""
