"""Liveness, readiness and other operational endpoints."""
