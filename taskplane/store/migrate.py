"""Run the Alembic migrations (``taskplane db upgrade``, ``dev up``, the test fixtures).

Alembic's async env runs its own event loop, so ``upgrade`` always runs it in a worker
thread: callers inside a running loop (the gateway, an async test) can call it too.
"""

from __future__ import annotations

import threading
from pathlib import Path

from taskplane.errors import UserError
from taskplane.store.db import describe_url, is_unreachable, validate_url

#: Alembic's ``context`` and ``op`` are process-wide proxies: one migration run at a time
#: per process (across processes, env.py's advisory lock serialises them).
_PROCESS_LOCK = threading.Lock()

#: The project root holds ``alembic.ini`` and ``migrations/``.
_ROOT = Path(__file__).resolve().parents[2]


def migrations_dir() -> Path:
    """Where the Alembic scripts live (``migrations/`` next to the package)."""
    path = _ROOT / "migrations"
    if not (path / "env.py").is_file():
        raise UserError(f"Alembic migrations not found at {path}; run from a taskplane source checkout")
    return path


def _config(database_url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    ini = _ROOT / "alembic.ini"
    cfg = Config(str(ini)) if ini.is_file() else Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["database_url"] = database_url
    return cfg


def _run_in_thread(database_url: str, revision: str, downgrade: bool) -> None:
    from alembic import command

    cfg = _config(database_url)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            with _PROCESS_LOCK:
                _run()
        except BaseException as exc:
            errors.append(exc)

    def _run() -> None:
        if downgrade:
            command.downgrade(cfg, revision)
        else:
            command.upgrade(cfg, revision)

    worker = threading.Thread(target=target, name="taskplane-migrate", daemon=True)
    worker.start()
    worker.join()
    if errors:
        exc = errors[0]
        if is_unreachable(exc):
            raise UserError(
                f"cannot reach Postgres at {describe_url(database_url)} ({_first_line(exc)}); "
                "start it (`taskplane dev up`) or fix TASKPLANE_DATABASE_URL"
            ) from exc
        raise exc


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (default head). Safe to call concurrently and repeatedly."""
    try:
        url = validate_url(database_url)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    _run_in_thread(url, revision, downgrade=False)


def downgrade(database_url: str, revision: str) -> None:
    """Revert migrations down to ``revision`` (``base`` removes everything)."""
    try:
        url = validate_url(database_url)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    _run_in_thread(url, revision, downgrade=True)
