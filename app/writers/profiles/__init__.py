"""Profiles: the protocols memory models are trained on, each mapped onto our ops."""

from __future__ import annotations

from pathlib import Path

from app.writers.profiles.base import ModelSession, ParseError, Profile, ProfileResult, PromptSet
from app.writers.profiles.hy_memory import HyMemoryProfile
from app.writers.profiles.mem0 import Mem0Profile
from app.writers.profiles.memos import MemosProfile
from app.writers.profiles.simple import SimpleProfile

PROFILES = {p.name: p for p in (HyMemoryProfile, Mem0Profile, SimpleProfile, MemosProfile)}

__all__ = [
    "PROFILES",
    "ModelSession",
    "ParseError",
    "Profile",
    "ProfileResult",
    "PromptSet",
    "get_profile",
]


def get_profile(name: str, prompts_dir: Path | None = None) -> Profile:
    try:
        factory = PROFILES[name]
    except KeyError:
        msg = f"unknown writer profile {name!r} (available: {', '.join(sorted(PROFILES))})"
        raise ValueError(msg) from None
    profile: Profile = factory(prompts_dir)
    return profile
