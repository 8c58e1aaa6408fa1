#!/usr/bin/env bash
# Run the test suite: installs what it needs into a virtualenv, then pytest against real
# servers (a moto server and SeaweedFS, both started by the tests themselves), a directory
# (file://) and the in-process store.
#
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -m behaviour    # the backend behaviour suite only
#   bash scripts/test.sh -n 0 tests/test_cli.py   # in one process
#   PYTHON=python3.13 bash scripts/test.sh
#
# The tests run in parallel (pytest-xdist, OBJMANIFEST_TEST_WORKERS workers, default 4: the
# suite mostly waits on servers, child processes and leases, so more workers than cores
# pay); an -n of your own, or -p no:xdist, replaces that.
#
# Environment: PYTHON (interpreter for the venv, default python3), VENV (default .venv),
# OBJMANIFEST_TEST_BACKENDS (default memory,file,moto,seaweedfs; azurite adds Azure's
# emulator, installed with npm into OBJMANIFEST_AZURITE_DIR, default
# ~/.cache/objmanifest/azurite), OBJMANIFEST_TEST_ENDPOINT (any S3),
# OBJMANIFEST_TEST_GCS_ENDPOINT (a GCS emulator for the gcs-endpoint backend),
# OBJMANIFEST_TEST_WORKERS (default 4).
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite starts hundreds of Python processes (workers, agents, commands) and each worker
# collects every test module: bytecode cached in __pycache__ (ignored by git), the tests'
# with their rewritten asserts, spares each of them compiling it again. An environment that
# says not to write it (PYTHONDONTWRITEBYTECODE) is not followed for the run.
unset PYTHONDONTWRITEBYTECODE

python=${PYTHON:-python3}
venv=${VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
source scripts/venv.sh
pip_into "$venv" -e '.[test]'

# Debian packages the tests need, installed when run as root: one apt at a time (CI makes
# several venvs at once, each through this script).
debian_package() {
    local lock=()
    if command -v flock >/dev/null; then lock=(flock /tmp/objmanifest-apt.lock); fi
    "${lock[@]}" bash -c \
        'dpkg -s "$1" >/dev/null 2>&1 || { apt-get update -qq >/dev/null &&
            apt-get install -y -qq "$1" >/dev/null; }' apt "$1"
}

# The clock-skew tests run agents under libfaketime (Debian package `faketime`).
if ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        debian_package faketime
    else
        echo "scripts/test.sh: libfaketime is missing; install it: sudo apt-get install faketime" >&2
        exit 1
    fi
fi

# The web page's browser test drives Debian's headless Chromium with Playwright (no browser
# download: it is given /usr/bin/chromium).
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        debian_package chromium
    else
        echo "scripts/test.sh: Chromium is missing; install it: sudo apt-get install chromium" >&2
        exit 1
    fi
fi

# tests/test_integrity.py checks a downloaded file with xxhsum (Debian package `xxhash`).
if ! command -v xxhsum >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        debian_package xxhash
    else
        echo "scripts/test.sh: xxhsum is missing; install it: sudo apt-get install xxhash" >&2
        exit 1
    fi
fi

# Azurite, the emulator of the az:// backend, is an npm package (Node.js): installed into a
# directory of ours, once, when a run names that backend.
case ",${OBJMANIFEST_TEST_BACKENDS:-}," in
    *,azurite,*)
        azurite_dir=${OBJMANIFEST_AZURITE_DIR:-$HOME/.cache/objmanifest/azurite}
        azurite_version=$("$venv/bin/python" -c \
            'from objmanifest.local.azurite import AZURITE_VERSION; print(AZURITE_VERSION)')
        if ! grep -qs "\"version\": \"$azurite_version\"" \
            "$azurite_dir/node_modules/azurite/package.json"; then
            if ! command -v npm >/dev/null; then
                echo "scripts/test.sh: the azurite backend needs Node.js and npm" >&2
                exit 1
            fi
            mkdir -p "$azurite_dir"
            flock "$azurite_dir" npm install --prefix "$azurite_dir" --no-audit --no-fund \
                --no-save --silent "azurite@$azurite_version" >/dev/null
        fi
        ;;
esac

parallel=(-n "${OBJMANIFEST_TEST_WORKERS:-4}" --dist loadgroup)
for arg in "$@"; do
    case $arg in
        -n | -n* | --numprocesses | --numprocesses=* | no:xdist | -pno:xdist) parallel=() ;;
    esac
done
exec "$venv/bin/python" -m pytest "${parallel[@]}" "$@"
