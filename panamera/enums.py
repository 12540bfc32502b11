"""`StrEnum`: the base of Panamera's closed vocabularies (forms, merge modes, buffer roles...).

A member is its value as a string (`Form.ROW == "ROW"`, `str(Form.ROW) == "ROW"`), so plans and
schedules serialize to the same JSON as plain strings, and a typo is an AttributeError at import
time rather than a silent mismatch.

>>> class Colour(StrEnum):
...     RED = "red"
>>> Colour.RED == "red", f"{Colour.RED}", Colour("red") is Colour.RED
(True, 'red', True)
"""

from __future__ import annotations

import enum

try:  # Python 3.11+
    from enum import StrEnum
except ImportError:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


__all__ = ["StrEnum"]
