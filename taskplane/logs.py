"""structlog set-up with redaction: prompts, messages and keys never reach the logs."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_KEYS = {"authorization", "api_key", "apikey", "token", "password", "messages", "prompt", "content",
                "x-api-key", "secret", "admin_token"}


#: Credentials that show up inside free text (an error message quoting a header, a URL).
_INLINE_SECRET = re.compile(r"(?i)\b(bearer|basic)\s+[^\s\"',;]+|(://[^/\s:@]+:)[^@\s/]+@")


def _scrub_text(text: str) -> str:
    return _INLINE_SECRET.sub(lambda m: f"{m.group(1)} [redacted]" if m.group(1) else f"{m.group(2)}[redacted]@", text)


def _scrub(obj: Any, depth: int = 0) -> Any:
    if depth > 20:
        return "[redacted: too deep]"
    if isinstance(obj, dict):
        return {k: ("[redacted]" if str(k).lower() in _SECRET_KEYS else _scrub(v, depth + 1)) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [_scrub(v, depth + 1) for v in obj]
    if isinstance(obj, str):
        return _scrub_text(obj)
    return obj


def redact(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Replace values of sensitive keys (at any depth of dicts and lists) with a marker, and
    bearer tokens or URL passwords inside any string (the event text included)."""
    for key in list(event_dict):
        if str(key).lower() in _SECRET_KEYS:
            event_dict[key] = "[redacted]"
        else:
            event_dict[key] = _scrub(event_dict[key])
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
