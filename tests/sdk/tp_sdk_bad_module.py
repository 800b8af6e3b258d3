"""An agent module with an import-time side effect: the worker must refuse it clearly."""

from __future__ import annotations

from datetime import datetime

from taskplane import agent

LOADED_AT = datetime.now()  # reads the clock at import: not allowed in an agent module


@agent(name="tp_bad_module")
async def bad(x: int) -> int:
    return x
