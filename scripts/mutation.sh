#!/usr/bin/env bash
# Mutation testing of the pure core (objmanifest/core/changes.py, commands.py, states.py,
# leases.py, verbs.py) and the CAS loop (objmanifest/cas/loop.py, blocks.py, policy.py) against
# their fast unit tests (tests/unit), with mutmut; [tool.mutmut] in pyproject.toml lists them. Installs what it needs into a virtualenv, runs every
# mutant from scratch, prints per module how many were killed, and fails if one survived
# that docs/mutation.md does not explain as equivalent.
#
#   bash scripts/mutation.sh
#   PYTHON=python3.13 VENV=/tmp/venv bash scripts/mutation.sh
#
# Environment: PYTHON (interpreter for the venv, default python3), VENV (default .venv),
# JOBS (mutants run at once, default the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=${VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
source scripts/venv.sh
pip_into "$venv" -e '.[mutation]'

rm -rf mutants
mkdir -p mutants
log=mutants/run.log
start=$(date +%s)
# mutmut must find the package only in its mutated copy: run it with the venv's tools first
# on PATH and no PYTHONPATH pointing back at the tree.
if ! env -u PYTHONPATH PATH="$venv/bin:$PATH" "$venv/bin/mutmut" run \
        --max-children "${JOBS:-$(nproc)}" >"$log" 2>&1; then
    tail -c 3000 "$log" >&2
    echo "scripts/mutation.sh: mutmut failed; its output is in $log" >&2
    exit 1
fi
echo "mutmut $("$venv/bin/mutmut" --version | awk '{print $NF}'): $(( $(date +%s) - start )) s"
exec "$venv/bin/python" scripts/mutation_report.py
