"""The error vocabulary of the gateway (DESIGN.md contract) shared by every part.

One place maps an error type to its HTTP status and to whether a retry can help,
so the gateway, the SDK's retry policy and the reports agree.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorType(StrEnum):
    INVALID_REQUEST = "invalid_request"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    MODEL_NOT_FOUND = "model_not_found"
    OVERLOADED = "overloaded"
    NO_REPLICA = "no_replica"
    DEADLINE_UNMEETABLE = "deadline_unmeetable"
    REPLICA_ERROR = "replica_error"
    PAYLOAD_TOO_LARGE = "payload_too_large"


STATUS_OF: dict[ErrorType, int] = {
    ErrorType.INVALID_REQUEST: 400,
    ErrorType.UNAUTHORIZED: 401,
    ErrorType.FORBIDDEN: 403,
    ErrorType.MODEL_NOT_FOUND: 404,
    ErrorType.PAYLOAD_TOO_LARGE: 413,
    ErrorType.OVERLOADED: 429,
    ErrorType.REPLICA_ERROR: 502,
    ErrorType.NO_REPLICA: 503,
    ErrorType.DEADLINE_UNMEETABLE: 504,
}

#: Errors a retry cannot fix: the SDK fails the task fast on these.
NON_RETRYABLE: frozenset[ErrorType] = frozenset(
    {
        ErrorType.INVALID_REQUEST,
        ErrorType.UNAUTHORIZED,
        ErrorType.FORBIDDEN,
        ErrorType.MODEL_NOT_FOUND,
        ErrorType.PAYLOAD_TOO_LARGE,
        ErrorType.DEADLINE_UNMEETABLE,
    }
)


def describe_validation(exc: Any, *, limit: int = 5, top: str = "(top level)") -> str:
    """One line from a pydantic ValidationError: ``field.path: message; ...``."""
    parts = []
    for e in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in e["loc"]) or top
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


class TaskplaneError(Exception):
    """An error with a type from the contract, a message for the user and an optional Retry-After."""

    def __init__(
        self, error_type: ErrorType, message: str, *, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.retry_after_s = retry_after_s

    @property
    def status(self) -> int:
        return STATUS_OF[self.error_type]

    @property
    def retryable(self) -> bool:
        return self.error_type not in NON_RETRYABLE

    def body(self) -> dict[str, Any]:
        return {"error": {"type": str(self.error_type), "message": self.message}}


class ConfigError(Exception):
    """A configuration file or flag is wrong; the message says what and how to fix it."""


class UserError(Exception):
    """A problem the user can fix (port taken, service unreachable); printed as one line."""
