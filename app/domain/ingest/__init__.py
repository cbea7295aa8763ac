"""Durable ingestion: chunks are numbered per scope and committed before they are acknowledged."""
