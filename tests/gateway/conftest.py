"""A real local cluster (simulated replicas + gateway processes) recording to the real
embedded Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from taskplane.dev.local import LocalCluster


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("gw")), replicas=3, gpus=["h100", "l40s", "h100"], database_url=pg_url)
    with c:
        yield c
