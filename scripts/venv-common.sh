# shellcheck shell=bash
# What install-vllm.sh and install-peers.sh share: each installs pinned PyPI packages into a
# venv of its own, idempotently (a stamp records the versions; a second run only re-checks
# them). Sourced, not run. The caller sets, before calling these:
#   TAG    log prefix             VENV   venv directory     PY_OVERRIDE  interpreter, or empty
#   STAMP  stamp file             WANT   what the stamp must say
#   FORCE  1 to reinstall even if the stamp matches
# and defines verify(), which prints the installed versions and fails when they do not import.

log() { printf '[%s] %s\n' "$TAG" "$*" >&2; }

# The interpreter for the venv: the override, else python3.11 (what the wheels are built
# for), else python3.
pick_python() {
    if [[ -n "$PY_OVERRIDE" ]]; then
        echo "$PY_OVERRIDE"
    elif command -v python3.11 >/dev/null 2>&1; then
        echo python3.11
    else
        echo python3
    fi
}

# Exit 0 (the whole script) when the stamp matches and the packages still import.
exit_if_installed() {
    local out
    if [[ "$FORCE" != "1" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
        if out="$(verify 2>/dev/null)"; then
            log "already installed in $VENV: $out"
            exit 0
        fi
        log "stamp present but the check failed; reinstalling"
    fi
}

# Create the venv if missing and set PIP to its pip (an array).
ensure_venv() {
    local py
    py="$(pick_python)"
    [[ -x "$VENV/bin/python" ]] || { log "creating venv $VENV with $py"; "$py" -m venv "$VENV"; }
    PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
}
