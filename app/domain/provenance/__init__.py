"""Provenance: why a memory says what it says — each version next to what its writer was shown."""
