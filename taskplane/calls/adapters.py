"""The LoRA adapter a call names, as vLLM and the OpenAI SDK name it.

A call runs with an adapter when its body's ``model`` is ``base:adapter`` (the base model a
pool serves, a colon, the adapter's name), or when it names the base model and the header
``X-Taskplane-Adapter``. vLLM serves an adapter as a model of the adapter's name, so the
replica is sent ``model = adapter``. Calls naming neither are untouched.
"""

from __future__ import annotations

from collections.abc import Mapping

from taskplane.errors import ErrorType, TaskplaneError

H_ADAPTER = "x-taskplane-adapter"
#: vLLM's adapter names are model names; longer ones are a client's mistake, not a name.
MAX_ADAPTER_LEN = 128


def check_adapter(name: str) -> str:
    """``name`` if it can be an adapter's name (printable ASCII without spaces or ``:``,
    1 to ``MAX_ADAPTER_LEN`` characters), else a 400 that says why."""
    if not name or len(name) > MAX_ADAPTER_LEN:
        raise TaskplaneError(ErrorType.INVALID_REQUEST,
                             f"adapter name must be 1 to {MAX_ADAPTER_LEN} characters (got {len(name)})")
    if not all(33 <= ord(c) <= 126 for c in name) or ":" in name:
        raise TaskplaneError(ErrorType.INVALID_REQUEST,
                             f"adapter name {name[:64]!r} must be printable ASCII without spaces or ':'")
    return name


def split_model(model: str, served: frozenset[str] | set[str]) -> tuple[str, str | None]:
    """The base model and the adapter ``model`` names: a served model's name is a base model
    even when it holds a colon (``llama3:8b``); otherwise ``base:adapter`` at the last colon
    whose left part is served."""
    if model in served or ":" not in model:
        return model, None
    base, _, adapter = model.rpartition(":")
    if base not in served:
        return model, None  # the pool lookup refuses it as model_not_found
    return base, check_adapter(adapter)


def call_adapter(model: str, served: frozenset[str] | set[str], headers: Mapping[str, str]) -> tuple[str, str | None]:
    """The base model and adapter of a call from its body's ``model`` and its headers; a
    header naming another adapter than the model string is contradictory (400)."""
    base, adapter = split_model(model, served)
    header = headers.get(H_ADAPTER)
    if header is None:
        return base, adapter
    named = check_adapter(header.strip())
    if adapter is not None and adapter != named:
        raise TaskplaneError(ErrorType.INVALID_REQUEST,
                             f"model names adapter {adapter!r} but header {H_ADAPTER} names {named[:64]!r}")
    return base, named
