"""Connecting to Postgres: URL normalisation, engines, and telling "unreachable" apart.

Every part that talks to Postgres goes through here so a ``postgres://`` URL from an
operator works like ``postgresql+asyncpg://``, passwords never reach a log line, and
"the database is down" is recognised the same way by the writer and the CLI.
"""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

CONNECT_TIMEOUT_S = 5.0


def normalize_url(url: str) -> str:
    """Return ``url`` with the asyncpg driver (``postgres://`` and ``postgresql://`` accepted)."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+asyncpg://" + url[len("postgresql://"):]
    return url


def describe_url(url: str) -> str:
    """The URL for messages: password hidden, still recognisable."""
    try:
        return make_url(normalize_url(url)).render_as_string(hide_password=True)
    except ArgumentError:
        return "<invalid database URL>"


def validate_url(url: str) -> str:
    """Normalise and check that ``url`` is a Postgres URL; raise ``ValueError`` with one line if not."""
    norm = normalize_url(url)
    try:
        parsed = make_url(norm)
    except ArgumentError:
        raise ValueError(f"not a database URL: {url!r} (expected postgresql+asyncpg://user@host:port/db)") from None
    if parsed.drivername != "postgresql+asyncpg":
        raise ValueError(
            f"unsupported database URL scheme {parsed.drivername!r}; use postgresql+asyncpg://user@host:port/db"
        )
    return norm


def create_engine(url: str, *, pool_size: int = 5) -> AsyncEngine:
    """An async engine that survives a Postgres restart (pre-ping) and fails fast when it is down."""
    return create_async_engine(
        validate_url(url),
        pool_pre_ping=True,
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args={"timeout": CONNECT_TIMEOUT_S, "command_timeout": 60},
    )


def is_unreachable(exc: BaseException) -> bool:
    """True when ``exc`` means "cannot talk to Postgres now" (down, restarting, network), not bad data."""
    if isinstance(exc, OSError | asyncio.TimeoutError | ConnectionError):
        return True
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated or isinstance(exc, InterfaceError):
            return True
        state = sqlstate(exc)
        # 08: connection exception; 57P: operator intervention (shutdown, cannot connect now)
        if state is not None and (state.startswith("08") or state.startswith("57P")):
            return True
        if isinstance(exc, OperationalError) and state is None:
            return True
        orig = exc.orig
        cause = getattr(orig, "__cause__", None)
        if isinstance(cause, OSError | asyncio.TimeoutError | ConnectionError):
            return True
    return False


def sqlstate(exc: BaseException) -> str | None:
    """The Postgres SQLSTATE of a driver error, if it carries one."""
    orig = getattr(exc, "orig", exc)
    for attr in ("sqlstate", "pgcode"):
        value = getattr(orig, attr, None)
        if isinstance(value, str):
            return value
    cause = getattr(orig, "__cause__", None)
    value = getattr(cause, "sqlstate", None)
    return value if isinstance(value, str) else None


def _admin_url(url: str) -> str:
    return make_url(validate_url(url)).set(database="postgres").render_as_string(hide_password=False)


async def create_database(server_url: str, name: str | None = None) -> str:
    """Create a fresh database on the server of ``server_url``; return its URL.

    Used to give a test (or a benchmark run) its own empty schema on a shared server.
    """
    name = name or f"tp_{uuid.uuid4().hex[:12]}"
    if not name.replace("_", "").isalnum():
        raise ValueError(f"database name must be alphanumeric or '_': {name!r}")
    engine = create_async_engine(_admin_url(server_url), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        await engine.dispose()
    return make_url(validate_url(server_url)).set(database=name).render_as_string(hide_password=False)


async def drop_database(url: str) -> None:
    """Drop the database of ``url`` (its connections are terminated first)."""
    name = make_url(validate_url(url)).database
    engine = create_async_engine(_admin_url(url), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n AND pid <> pg_backend_pid()"),
                {"n": name},
            )
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    finally:
        await engine.dispose()
