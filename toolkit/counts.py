"""Counts in words, for messages people read: ``1 task``, ``3 tasks``, ``3,204 tasks``."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, the noun in the plural unless the count is one.

    Args:
        count: how many; written with thousands separators.
        noun: the singular (``task``).
        plural: the plural when it is not ``noun + "s"`` (``evidence records``).

    Returns:
        E.g. ``"1 task"``, ``"0 tasks"``, ``"3,204 tasks"``.
    """
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
