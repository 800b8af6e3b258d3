"""structlog set-up with redaction: prompts, messages and keys never reach the logs."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_KEYS = {"authorization", "api_key", "apikey", "token", "password", "messages", "prompt", "content",
                "x-api-key", "secret", "admin_token"}


def redact(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replace values of sensitive keys (at any depth of dicts) with a marker."""
    def scrub(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: ("[redacted]" if str(k).lower() in _SECRET_KEYS else scrub(v)) for k, v in obj.items()}
        return obj

    for key in list(event_dict):
        if key.lower() in _SECRET_KEYS:
            event_dict[key] = "[redacted]"
        else:
            event_dict[key] = scrub(event_dict[key])
    return event_dict


def configure_logging(level: str | None = None, *, json_logs: bool | None = None) -> None:
    """Configure structlog once per process (JSON lines when not on a terminal)."""
    lvl = getattr(logging, (level or os.environ.get("TASKPLANE_LOG_LEVEL", "info")).upper(), logging.INFO)
    as_json = json_logs if json_logs is not None else not sys.stderr.isatty()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            redact,
            structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
