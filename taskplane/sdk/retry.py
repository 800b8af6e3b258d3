"""The one retry policy for LLM calls, and the one mapping from gateway errors to it.

Retries happen in exactly one place: Temporal's activity retry. The HTTP client never
retries; each Temporal attempt is one gateway request carrying ``X-Taskplane-Attempt``
and a stable ``X-Taskplane-Call-Id`` so the gateway can place it on another replica and
write its cost row idempotently. What may be retried comes from
:data:`taskplane.errors.NON_RETRYABLE`; a 429's ``Retry-After`` becomes the next retry's
delay; the task's remaining deadline budget bounds the whole retry loop (the activity's
schedule-to-close timeout), so a budget that runs out ends the task, not the retrying.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from taskplane.errors import NON_RETRYABLE, STATUS_OF, ErrorType

#: Raised by the activity when the deadline has passed or cannot be met by waiting.
DEADLINE_EXCEEDED = "deadline_exceeded"
CONNECTION_ERROR = "connection_error"
TIMEOUT = "timeout"
HTTP_ERROR = "http_error"

#: Failure types that mean "the deadline budget is gone": the task ends failed-deadline.
DEADLINE_TYPES = frozenset({DEADLINE_EXCEEDED, str(ErrorType.DEADLINE_UNMEETABLE)})

LLM_MAX_ATTEMPTS = 10

LLM_RETRY_POLICY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=LLM_MAX_ATTEMPTS,
    non_retryable_error_types=sorted({str(t) for t in NON_RETRYABLE} | {DEADLINE_EXCEEDED}),
)

#: Bookkeeping activities (task rows): quick retries, they must not hold up the task.
RECORD_RETRY_POLICY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    maximum_interval=timedelta(seconds=2),
    maximum_attempts=5,
)

_BY_STATUS = {status: etype for etype, status in STATUS_OF.items()}


def step_retry_policy(retries: int, non_retryable: list[str]) -> RetryPolicy:
    """A ``@step``'s policy: ``retries`` retries after the first attempt."""
    return RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=max(retries, 0) + 1,
        non_retryable_error_types=list(non_retryable),
    )


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds form); None if absent or odd."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_response(
    status: int, body: Any, retry_after: str | None, *, budget_ms: float | None
) -> ApplicationError:
    """The activity failure for a gateway error response.

    The type is the contract's error type (``overloaded``, ``deadline_unmeetable``...), so
    the retry policy's non-retryable list decides; a Retry-After longer than the budget
    left turns into ``deadline_exceeded`` at once instead of a retry that cannot finish.
    """
    error_type, message = _error_fields(status, body)
    retryable = _retryable(error_type, status)
    delay = parse_retry_after(retry_after)
    if retryable and delay is not None and budget_ms is not None and delay * 1000.0 >= budget_ms:
        return ApplicationError(
            f"gateway said {error_type} with Retry-After {delay:g}s, beyond the {budget_ms:.0f} ms budget left",
            {"status": status, "error_type": error_type},
            type=DEADLINE_EXCEEDED,
            non_retryable=True,
        )
    return ApplicationError(
        f"gateway {status} {error_type}: {message}",
        {"status": status, "error_type": error_type},
        type=error_type,
        non_retryable=not retryable,
        next_retry_delay=timedelta(seconds=delay) if (retryable and delay is not None) else None,
    )


def _error_fields(status: int, body: Any) -> tuple[str, str]:
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and err.get("type"):
        return str(err["type"]), str(err.get("message") or "")
    if isinstance(err, str):
        return str(_BY_STATUS.get(status, HTTP_ERROR)), err
    fallback = _BY_STATUS.get(status)
    if fallback is None:
        fallback = ErrorType.REPLICA_ERROR if status >= 500 else ErrorType.INVALID_REQUEST
    return str(fallback), str(body)[:300] if body else f"HTTP {status}"


def _retryable(error_type: str, status: int) -> bool:
    try:
        return ErrorType(error_type) not in NON_RETRYABLE
    except ValueError:
        # Unknown types: server-side trouble may pass, a client-side mistake will not.
        return status >= 500 or status in (408, 429)
