"""Counts in the words a person reads: "1 batch", "2 batches", "1,042 messages".

Shared by the daemon's commands, the pipeline's reports and the tools' demos, so that a
plural is spelt one way everywhere.

Rule: a count with its noun is worded by `counted` alone.
"""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and its noun, singular for one: "1 batch", "2 batches", "1,042 messages"."""
    if count == 1:
        return f"1 {noun}"
    many = plural or (f"{noun}es" if noun.endswith(("s", "sh", "ch", "x")) else f"{noun}s")
    return f"{count:,} {many}"
