"""What the examples share: the model they ask for and a tidy way to read a reply."""

from __future__ import annotations

#: The model of the dev stack's replica pool (override per task with the ``model`` argument).
DEFAULT_MODEL = "llama-3.1-8b"


def lines(text: str, limit: int) -> list[str]:
    """Non-empty lines (or sentences) of a reply, at most ``limit``: a model's list, parsed leniently."""
    parts = [p.strip(" -*0123456789.") for p in text.replace(". ", "\n").splitlines()]
    return [p for p in parts if p][:limit]
