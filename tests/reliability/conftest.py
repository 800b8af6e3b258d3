"""Fixtures of the reliability suite: a secured local cluster recording to the real Postgres."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tp_rel_env import secured_config

from taskplane.dev.local import LocalCluster


class _SecureCluster(LocalCluster):
    def config(self) -> dict[str, Any]:
        cfg = super().config()
        cfg.pop("auth", None)  # LocalCluster turns auth off; the gateway's own default must be on
        return cfg


@pytest.fixture(scope="module")
def secure(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = _SecureCluster(Path(tmp_path_factory.mktemp("secure")), replicas=2, database_url=pg_url,
                       config_overrides=secured_config())
    with c:
        yield c


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the fault matrix (if the fault suite ran) after the test results."""
    try:
        from tp_rel_stack import MATRIX, render_matrix
    except ImportError:
        return
    if MATRIX:
        terminalreporter.write_sep("=", "taskplane fault matrix")
        terminalreporter.write_line(render_matrix())
        out = os.environ.get("TASKPLANE_RELIABILITY_OUT")
        if out:
            Path(out).write_text(json.dumps(MATRIX, indent=2))
