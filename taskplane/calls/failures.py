"""How an attempt failed, and what follows from it, whatever carried it (the Python
proxy's httpx client or Envoy's upstream).

A ``Failure`` says everything the one failure path (``AttemptLifecycle.failed``) needs:
the contract error the client may get, whether another replica may still serve the call
(nothing reached the client yet, and the request itself was not refused), how the
registry should mark the replica, and the row's outcome. The classifiers below take
plain facts (a status code and body, a cause's name), never a transport's objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from taskplane.errors import ErrorType, TaskplaneError
from taskplane.store.records import Outcome


class ReplicaFault(StrEnum):
    """What a failure says about the replica (``ReplicaRegistry.mark_failure``)."""

    NONE = "none"  # the request was at fault (a 4xx), or the client left
    SOFT = "soft"  # may be overload: counts towards taking the replica out
    HARD = "hard"  # refused, reset, gone: out at once


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt: the client's error, retry or answer, the replica's mark, the row's outcome."""

    error: TaskplaneError
    retry: bool  # another replica may serve the call (nothing was sent to the client)
    fault: ReplicaFault
    outcome: Outcome = Outcome.ERROR


def unreachable(replica: str, cause: str, *, timeout: bool) -> Failure:
    """No answer: refused, reset or marked down (hard), or timed out (soft: may be overload)."""
    err = TaskplaneError(ErrorType.REPLICA_ERROR, f"replica {replica} failed: {cause}")
    return Failure(err, retry=True, fault=ReplicaFault.SOFT if timeout else ReplicaFault.HARD,
                   outcome=Outcome.TIMEOUT if timeout else Outcome.ERROR)


def engine_client_error(status: int, body: bytes) -> TaskplaneError:
    """An engine's 4xx as the contract's error: the request itself was refused, so a retry
    elsewhere would be refused too."""
    try:
        msg = json.loads(body).get("error", {}).get("message") or body[:200].decode("utf-8", "replace")
    except (ValueError, AttributeError):
        msg = body[:200].decode("utf-8", "replace")
    etype = ErrorType.MODEL_NOT_FOUND if status == 404 else ErrorType.INVALID_REQUEST
    return TaskplaneError(etype, f"the engine refused the request: {msg}")


def from_status(replica: str, status: int, body: bytes, adapter: str | None = None) -> Failure:
    """An error status from the engine (>= 400): 5xx and 429 are the replica's trouble
    (retry elsewhere); any other 4xx refuses the request itself (answer it). A 404 to a
    call with an adapter says the replica does not serve that adapter: another replica may,
    and this one is not at fault."""
    if status == 404 and adapter is not None:
        err = TaskplaneError(ErrorType.MODEL_NOT_FOUND, f"adapter {adapter!r} is not served on replica {replica}")
        return Failure(err, retry=True, fault=ReplicaFault.NONE, outcome=Outcome.ERROR)
    if status >= 500 or status == 429:
        err = TaskplaneError(ErrorType.REPLICA_ERROR, f"replica {replica} answered {status}")
        return Failure(err, retry=True, fault=ReplicaFault.SOFT)
    return Failure(engine_client_error(status, body), retry=False, fault=ReplicaFault.NONE)


def broken_response(replica: str, cause: str) -> Failure:
    """A unary answer that is not an OpenAI completion object (or broke while read)."""
    err = TaskplaneError(ErrorType.REPLICA_ERROR, f"replica {replica} sent a broken response: {cause}")
    return Failure(err, retry=True, fault=ReplicaFault.SOFT)


def broken_stream(replica: str, what: str, *, transport: bool) -> Failure:
    """A stream that did not finish: tokens may be out, so no retry. ``transport``: the
    connection broke (the replica is marked down), rather than the engine ending early."""
    err = TaskplaneError(ErrorType.REPLICA_ERROR, f"replica {replica} {what}")
    return Failure(err, retry=False, fault=ReplicaFault.HARD if transport else ReplicaFault.NONE)


def internal(replica: str, cause: str) -> Failure:
    """The gateway itself failed mid-attempt (a bug): settle the attempt, blame nobody."""
    err = TaskplaneError(ErrorType.REPLICA_ERROR, f"attempt on replica {replica} failed in the gateway: {cause}")
    return Failure(err, retry=False, fault=ReplicaFault.NONE)
