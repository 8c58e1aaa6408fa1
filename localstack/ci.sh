#!/usr/bin/env bash
# What CI runs against LocalStack: start it in host mode, run the behaviour suite and the
# demo against it, and stop it whatever happens.
#
#   PYTHON=/path/to/venv/bin/python localstack/ci.sh [pytest arguments]
#
# PYTHON is the interpreter with objmanifest and its test dependencies installed (default:
# python3). The pytest arguments default to `-m behaviour`; given ones replace them (for
# example `tests/test_chunked.py` runs the chunked-entry tests against LocalStack). The
# tests run on OBJMANIFEST_TEST_WORKERS pytest-xdist workers (default 4) unless the
# arguments give -n.
# LOCALSTACK_PORT picks the port (default: a free one). Exits non-zero if LocalStack does
# not start, a test fails, or the demo finds an inconsistency.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
PYTHON="${PYTHON:-python3}"
started=$SECONDS

if [[ -z "${LOCALSTACK_PORT:-}" ]]; then
    LOCALSTACK_PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
export LOCALSTACK_PORT
export LOCALSTACK_DIR="${LOCALSTACK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/objmanifest-localstack-ci.XXXXXX")}"

cleanup() {
    "$here/run-host.sh" stop || true
    rm -rf "$LOCALSTACK_DIR"
}
trap cleanup EXIT

endpoint="$("$here/run-host.sh" start)"
echo "localstack ci: LocalStack up at $endpoint after $((SECONDS - started))s"

export OBJMANIFEST_TEST_ENDPOINT="$endpoint"
export OBJMANIFEST_TEST_BUCKET="objmanifest-test"
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1
# LocalStack refuses a body whose Content-MD5 does not match, but the object the refused
# write would have replaced then reads as broken until the next write (docs/chunked.md).
export OBJMANIFEST_TEST_DIGESTS=refusal-breaks
unset AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_PROFILE AWS_SESSION_TOKEN

cd "$root"
t=$SECONDS
if (($# == 0)); then
    set -- -m behaviour
fi
parallel=(-n "${OBJMANIFEST_TEST_WORKERS:-4}" --dist loadgroup)
for arg in "$@"; do
    case $arg in
        -n | -n* | --numprocesses | --numprocesses=* | no:xdist | -pno:xdist) parallel=() ;;
    esac
done
"$PYTHON" -m pytest -q -p no:cacheprovider "${parallel[@]}" "$@"
echo "localstack ci: tests passed in $((SECONDS - t))s"

t=$SECONDS
"$PYTHON" -m objmanifest.demo --endpoint-url "$endpoint" --bucket objmanifest-demo \
    --files 6 --big-mib 16 --agents 2
echo "localstack ci: demo passed in $((SECONDS - t))s"
echo "localstack ci: all passed in $((SECONDS - started))s"
