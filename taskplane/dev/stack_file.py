"""The dev stack's records under its state directory: ``stack.json`` (what ``up`` started,
so ``down`` stops exactly that and a second ``up`` finds the running stack) and the
autoscaler's ``autoscale.json`` (the replicas it runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def stack_file(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def load(state_dir: Path) -> dict[str, Any] | None:
    """What ``up`` recorded, or None (no stack, or an unreadable record)."""
    f = stack_file(state_dir)
    if not f.exists():
        return None
    try:
        return dict(json.loads(f.read_text()))
    except (OSError, ValueError):
        return None


def save(state_dir: Path, info: dict[str, Any]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = stack_file(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(stack_file(state_dir))


def autoscaled_replicas(state_dir: Path) -> list[dict[str, Any]]:
    """The replicas the dev autoscaler runs, as it records them in ``autoscale.json``."""
    try:
        data = json.loads((state_dir / "autoscale.json").read_text())
    except (OSError, ValueError):
        return []
    return list(data.get("replicas", []))
