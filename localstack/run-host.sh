#!/usr/bin/env bash
# LocalStack S3 in host mode: no Docker, no auth token.
#
#   localstack/run-host.sh start     install (once) and start it; prints the endpoint
#   localstack/run-host.sh stop      stop it
#   localstack/run-host.sh status    is it running?
#   localstack/run-host.sh env       the environment lines to point tools at it
#
# Settings (environment):
#   LOCALSTACK_PORT     port on 127.0.0.1 (default 4566)
#   LOCALSTACK_PYTHON   Python >= 3.13 to build the venv with (default: found on PATH or pyenv)
#   LOCALSTACK_VENV     where the venv lives (default ~/.cache/objmanifest/localstack-2026.3.0)
#   LOCALSTACK_DIR      state, log and pid file (default ${TMPDIR:-/tmp}/objmanifest-localstack-PORT)
#   LOCALSTACK_WAIT     seconds to wait for readiness (default 180)
#
# localstack-core 2026.3.0 imports warnings.deprecated, so it needs Python 3.13 or newer.
# The pins keep it importable: cbor2 6 removed cbor2._decoder, and pyOpenSSL 25 removed
# X509.add_extensions, which its self-signed certificate code uses.
set -euo pipefail
# pip_into: uv, or pip where uv cannot install.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/venv.sh"

VERSION="2026.3.0"
REQUIREMENTS=("localstack-core[base-runtime]==${VERSION}" "cbor2<6" "pyopenssl<25" "cryptography<45" "service-identity")
PORT="${LOCALSTACK_PORT:-4566}"
VENV="${LOCALSTACK_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/objmanifest/localstack-${VERSION}}"
STATE="${LOCALSTACK_DIR:-${TMPDIR:-/tmp}/objmanifest-localstack-${PORT}}"
WAIT="${LOCALSTACK_WAIT:-180}"
PIDFILE="$STATE/localstack.pid"
LOG="$STATE/localstack.log"
ENDPOINT="http://127.0.0.1:${PORT}"

say() { echo "localstack: $*" >&2; }
die() { say "$*"; exit 1; }

python_ok() {  # is $1 a Python >= 3.13?
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 13) else 1)' 2>/dev/null
}

find_python() {
    if [[ -n "${LOCALSTACK_PYTHON:-}" ]]; then
        python_ok "$LOCALSTACK_PYTHON" || die "LOCALSTACK_PYTHON=$LOCALSTACK_PYTHON is not Python >= 3.13"
        echo "$LOCALSTACK_PYTHON"
        return
    fi
    local candidate
    for candidate in python3.14 python3.13 \
        "$HOME"/.pyenv/versions/3.14*/bin/python3 "$HOME"/.pyenv/versions/3.13*/bin/python3 \
        python3; do
        if command -v "$candidate" >/dev/null 2>&1 && python_ok "$candidate"; then
            command -v "$candidate"
            return
        fi
    done
    die "no Python >= 3.13 found (localstack-core $VERSION needs it); set LOCALSTACK_PYTHON"
}

install() {
    local stamp="$VENV/.objmanifest-requirements"
    if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "${REQUIREMENTS[*]}" ]]; then
        return
    fi
    local python
    python="$(find_python)"
    say "installing localstack-core $VERSION into $VENV (with $python)"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$python" -m venv "$VENV"
    pip_into "$VENV" "${REQUIREMENTS[@]}"
    echo "${REQUIREMENTS[*]}" >"$stamp"
}

running_pid() {  # the pid of our LocalStack, if it still runs
    [[ -f "$PIDFILE" ]] || return 1
    local pid
    pid="$(cat "$PIDFILE")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

healthy() {  # does /_localstack/health say S3 is up?
    "$VENV/bin/python" - "$ENDPOINT" <<'EOF' 2>/dev/null
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/_localstack/health", timeout=2) as r:
    s3 = json.load(r).get("services", {}).get("s3")
sys.exit(0 if s3 in ("available", "running") else 1)
EOF
}

port_free() {
    "$VENV/bin/python" - "$PORT" <<'EOF'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
}

start() {
    if running_pid >/dev/null; then
        say "already running at $ENDPOINT (pid $(running_pid))"
        echo "$ENDPOINT"
        return
    fi
    install
    port_free || die "port $PORT on 127.0.0.1 is in use; set LOCALSTACK_PORT"
    mkdir -p "$STATE/data"
    say "starting on $ENDPOINT (log: $LOG)"
    # Its own session, so stop can signal LocalStack and everything it started.
    OVERRIDE_IN_DOCKER=0 GATEWAY_LISTEN="127.0.0.1:${PORT}" SERVICES=s3 EAGER_SERVICE_LOADING=1 \
        DNS_ADDRESS=0 DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1 FILESYSTEM_ROOT="$STATE/data" \
        setsid "$VENV/bin/python" -m localstack.runtime.main >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    local waited=0
    until healthy; do
        if ! running_pid >/dev/null; then
            tail -n 20 "$LOG" >&2 || true
            die "LocalStack exited before it was ready"
        fi
        if ((waited >= WAIT * 2)); then
            tail -n 20 "$LOG" >&2 || true
            stop
            die "LocalStack not ready after ${WAIT}s"
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
    say "ready after $((waited / 2))s"
    echo "$ENDPOINT"
}

stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PIDFILE"
        say "not running"
        return
    fi
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 40); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.25
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
    say "stopped (pid $pid)"
}

env_lines() {
    # LocalStack accepts any credentials; "test" is its convention, not a secret.
    cat <<EOF
export OBJMANIFEST_TEST_ENDPOINT=$ENDPOINT
export AWS_ENDPOINT_URL=$ENDPOINT
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_DEFAULT_REGION=us-east-1
EOF
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status)
        if pid="$(running_pid)"; then echo "running at $ENDPOINT (pid $pid)"; else echo "not running"; exit 1; fi
        ;;
    env) env_lines ;;
    install) install ;;
    *) echo "usage: $0 start|stop|status|env|install" >&2; exit 2 ;;
esac
