"""A real gateway process with auth on (tenant keys stored as sha256, an admin token) and
small limits in front of two simulated replicas, for the bad-input tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tp_badinput_env import auth_config

from taskplane.dev.local import LocalCluster


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("badinput")), replicas=2, config_overrides=auth_config())
    with c:
        yield c
