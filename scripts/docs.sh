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
source scripts/venv.sh
pip_into "$venv" -e '.[docs]'

mkdir -p "$(dirname "$site")"
# --strict turns every warning into a failure; the theme's notice about its successor is
# not a warning of this build.
NO_MKDOCS_2_WARNING=1 exec "$venv/bin/python" -m mkdocs build --strict --clean \
    --site-dir "$site"
