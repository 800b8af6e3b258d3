"""The plugin registry: plugin types by extension point and registered name, and the
validation of their parameters (every error a ``ConfigError`` that names the plugin)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING
from typing import Any, TypeVar

from taskplane.errors import ConfigError
from taskplane.scheduler.framework.plugin import Kind, Plugin

P = TypeVar("P", bound=type[Plugin])


class Registry:
    """Plugin types by extension point and registered name."""

    def __init__(self) -> None:
        self._types: dict[Kind, dict[str, type[Plugin]]] = {k: {} for k in Kind}

    def register(self, type_name: str) -> Callable[[P], P]:
        def deco(cls: P) -> P:
            table = self._types[cls.kind]
            if type_name in table and table[type_name] is not cls:
                raise ValueError(f"{cls.kind} plugin type {type_name!r} is registered twice")
            cls.type_name = type_name
            table[type_name] = cls
            return cls

        return deco

    def types(self, kind: Kind) -> dict[str, type[Plugin]]:
        return dict(self._types[kind])

    def get(self, kind: Kind, type_name: str) -> type[Plugin]:
        cls = self._types[kind].get(type_name)
        if cls is None:
            known = ", ".join(sorted(self._types[kind])) or "(none)"
            raise ConfigError(f"scheduler {kind} {type_name!r}: no such plugin type; known {kind}s: {known}")
        return cls

    def build(self, kind: Kind, spec: Any, *, policy: str = "custom") -> Plugin:
        """Build a plugin from a ``PluginConfig`` (or a mapping with type/weight/params/name,
        or just a type name). Every error is a ``ConfigError`` that names the plugin."""
        if isinstance(spec, str):
            type_name, weight, params, name = spec, 1.0, {}, None
        elif isinstance(spec, Mapping):
            type_name = spec.get("type", "")
            weight = spec.get("weight", 1.0)
            params = dict(spec.get("params") or {})
            name = spec.get("name")
        else:
            type_name = getattr(spec, "type", "")
            weight = getattr(spec, "weight", 1.0)
            params = dict(getattr(spec, "params", None) or {})
            name = getattr(spec, "name", None)
        cls = self.get(kind, str(type_name))
        where = f"scheduler {kind} {type_name!r}"
        try:
            weight = float(weight)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: weight {weight!r} is not a number") from None
        if weight < 0 or not math.isfinite(weight):
            raise ConfigError(f"{where}: weight must be a finite number >= 0, got {weight}")
        p = build_params(cls.Params, params, where)
        try:
            return cls(p, name=name, weight=weight, policy=policy)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def describe(self) -> list[dict[str, Any]]:
        """Every registered plugin with its parameters (for docs and ``--help`` output)."""
        out = []
        for kind in Kind:
            for type_name, cls in sorted(self._types[kind].items()):
                fields = []
                for f in dataclasses.fields(cls.Params):
                    default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc,operator]
                    fields.append({"name": f.name, "default": default, "doc": f.metadata.get("doc", "")})
                out.append({"kind": str(kind), "type": type_name, "doc": (cls.__doc__ or "").strip(), "params": fields})
        return out


REGISTRY = Registry()
register = REGISTRY.register

_SCALARS = (bool, int, float, str)


def _check_type(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_check_type(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (list, tuple, set, frozenset):
        return isinstance(value, list | tuple | set | frozenset)
    if origin is dict:
        return isinstance(value, Mapping)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def build_params(cls: type, params: Mapping[str, Any], where: str) -> Any:
    """Validate ``params`` against the ``Params`` dataclass ``cls``."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields)) or "none"
        raise ConfigError(f"{where}: unknown parameter(s) {', '.join(unknown)}; known: {known}")
    hints = typing.get_type_hints(cls)
    for key, value in params.items():
        hint = hints.get(key, Any)
        if not _check_type(value, hint):
            raise ConfigError(f"{where}: parameter {key}={value!r} should be {getattr(hint, '__name__', hint)}")
    try:
        obj = cls(**params)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    check = getattr(obj, "validate", None)
    if check is not None:
        try:
            check()
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    for k, h in hints.items():
        if h is float and isinstance(getattr(obj, k), int):
            setattr(obj, k, float(getattr(obj, k)))
    return obj
