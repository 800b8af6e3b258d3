"""The contract's error bodies as HTTP responses (``{"error": {"type", "message"}}``)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from taskplane.errors import ErrorType, TaskplaneError


def error_response(exc: TaskplaneError) -> JSONResponse:
    """The contract's error body (``{"error": {"type", "message"}}``), with Retry-After when shed."""
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def plain_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """DESIGN.md's error body for statuses outside the gateway's own vocabulary (404 route, 405, 408)."""
    return JSONResponse({"error": {"type": str(ErrorType.INVALID_REQUEST), "message": message}}, status_code=status,
                        headers=headers)
