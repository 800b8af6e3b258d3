#!/usr/bin/env bash
# Install the peer routers taskplane is compared with (sglang-router, vllm-router) into
# their own virtual environment, so `taskplane bench --engine vllm` can start them as
# subprocesses. Their code is installed from PyPI, never vendored.
#
# Idempotent: a stamp records the versions; a second run only re-checks the imports.
#
# Environment overrides:
#   TASKPLANE_PEERS_VENV        venv directory          (default: <project>/.venv-peers)
#   TASKPLANE_PEERS_PYTHON      interpreter for it      (default: python3.11, else python3)
#   TASKPLANE_SGLANG_ROUTER     sglang-router release   (default: 0.3.2)
#   TASKPLANE_VLLM_ROUTER       vllm-router release     (default: 0.1.17)
#   TASKPLANE_PEERS_FORCE=1     reinstall even if the stamp matches
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TASKPLANE_PEERS_VENV:-$ROOT/.venv-peers}"
SGLANG_ROUTER="${TASKPLANE_SGLANG_ROUTER:-0.3.2}"
VLLM_ROUTER="${TASKPLANE_VLLM_ROUTER:-0.1.17}"
TAG=install-peers
PY_OVERRIDE="${TASKPLANE_PEERS_PYTHON:-}"
FORCE="${TASKPLANE_PEERS_FORCE:-0}"
STAMP="$VENV/.taskplane-peers-stamp"
WANT="sglang-router==$SGLANG_ROUTER vllm-router==$VLLM_ROUTER"
# shellcheck source=scripts/venv-common.sh
source "$ROOT/scripts/venv-common.sh"

verify() {
    "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import importlib.util
for dist, module in (("sglang-router", "sglang_router"), ("vllm-router", "vllm_router")):
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"{dist}: module {module} not importable")
    print(f"{dist} {md.version(dist)}", end="; ")
print()
PY
}

exit_if_installed

start=$(date +%s)
ensure_venv
"${PIP[@]}" install --quiet --upgrade pip
log "installing $WANT"
"${PIP[@]}" install "sglang-router==$SGLANG_ROUTER" "vllm-router==$VLLM_ROUTER"
out="$(verify)"
echo "$WANT" > "$STAMP"
log "ok: $out($(( $(date +%s) - start ))s)"
