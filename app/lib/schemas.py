"""Response bodies read off objects that carry the same attribute names."""

from __future__ import annotations

from typing import Self

import msgspec


class Out(msgspec.Struct):
    """A response body whose fields are read, by name, off an ORM row, a dataclass or any object."""

    @classmethod
    def of(cls, obj: object) -> Self:
        return msgspec.convert(obj, cls, from_attributes=True)
