"""Tenants, API keys, and resolving a request's key into a principal with roles."""
