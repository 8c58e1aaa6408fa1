#!/usr/bin/env bash
# Run the test suite: installs what it needs into a virtualenv, then pytest against real
# servers (a moto server and SeaweedFS, both started by the tests themselves).
#
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -m behaviour    # the backend behaviour suite only
#   PYTHON=python3.13 bash scripts/test.sh
#
# Environment: PYTHON (interpreter for the venv, default python3), VENV (default .venv),
# OBJMANIFEST_TEST_BACKENDS (default moto,seaweedfs), OBJMANIFEST_TEST_ENDPOINT (any S3).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=${VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test]' \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

# The clock-skew tests run agents under libfaketime (Debian package `faketime`).
if ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq >/dev/null && apt-get install -y -qq faketime >/dev/null
    else
        echo "scripts/test.sh: libfaketime is missing; install it: sudo apt-get install faketime" >&2
        exit 1
    fi
fi

# The web page's browser test drives Debian's headless Chromium with Playwright (no browser
# download: it is given /usr/bin/chromium).
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null
    else
        echo "scripts/test.sh: Chromium is missing; install it: sudo apt-get install chromium" >&2
        exit 1
    fi
fi

# tests/test_integrity.py checks a downloaded file with xxhsum (Debian package `xxhash`).
if ! command -v xxhsum >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq >/dev/null && apt-get install -y -qq xxhash >/dev/null
    else
        echo "scripts/test.sh: xxhsum is missing; install it: sudo apt-get install xxhash" >&2
        exit 1
    fi
fi

exec "$venv/bin/python" -m pytest "$@"
