#!/usr/bin/env bash
# Build the documentation site (mkdocs.yml, docs/) and fail on any warning: a broken link or
# anchor, a page left out of the nav, a docstring the API reference cannot render.
#
#   bash scripts/docs.sh                      # into .ci/.work/site
#   VENV=.ci/.work/venv3.11 bash scripts/docs.sh
#   SITE_DIR=/tmp/site bash scripts/docs.sh
#
# Environment: VENV (the virtualenv to install the docs extra into, default .venv; made with
# PYTHON, default python3, if it does not exist), SITE_DIR (default .ci/.work/site).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=${VENV:-.venv}
site=${SITE_DIR:-.ci/.work/site}
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
# One install at a time in this tree, as scripts/test.sh does (the editable build writes
# objmanifest.egg-info here).
locked() { if command -v flock >/dev/null; then flock pyproject.toml "$@"; else "$@"; fi; }
locked "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[docs]' \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

mkdir -p "$(dirname "$site")"
# --strict turns every warning into a failure; the theme's notice about its successor is
# not a warning of this build.
NO_MKDOCS_2_WARNING=1 exec "$venv/bin/python" -m mkdocs build --strict --clean \
    --site-dir "$site"
