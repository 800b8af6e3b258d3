"""A real gateway cluster (simulated replicas) recording to the real Postgres, for the examples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from taskplane.dev.local import LocalCluster


@pytest.fixture(scope="module")
def ex_cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(Path(tmp_path_factory.mktemp("examples-gw")), replicas=2, gpus=["h100", "l40s"],
                     database_url=pg_url, speed=50.0)
    with c:
        yield c
