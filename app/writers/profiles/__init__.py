"""Profiles: the protocols memory models are trained on, each spoken as its reference framework speaks
it (`app.writers.references`) and mapped onto our ops; `simple` is Memstore's own."""

from __future__ import annotations

from pathlib import Path

from app.writers import references
from app.writers.profiles.base import ModelSession, ParseError, Profile, ProfileResult, PromptSet
from app.writers.profiles.hy_memory import HyMemoryProfile
from app.writers.profiles.mem0 import Mem0Profile
from app.writers.profiles.mem0_v3 import Mem0AdditiveProfile
from app.writers.profiles.memos import MemosProfile
from app.writers.profiles.simple import SimpleProfile

PROFILES = {
    p.name: p for p in (HyMemoryProfile, Mem0Profile, Mem0AdditiveProfile, SimpleProfile, MemosProfile)
}
# The reference release each profile speaks (`simple` is Memstore's own).
PROFILE_REFERENCES: dict[str, references.Reference] = {
    HyMemoryProfile.name: references.HY_MEMORY,
    Mem0Profile.name: references.MEM0_CLASSIC,
    Mem0AdditiveProfile.name: references.MEM0_ADDITIVE,
    MemosProfile.name: references.MEMOS,
}

__all__ = [
    "PROFILES",
    "PROFILE_REFERENCES",
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
