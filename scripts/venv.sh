# Sourced by the scripts that make a virtualenv (test.sh, docs.sh, mutation.sh,
# localstack/run-host.sh): one way to install into it.
#
#   pip_into VENV ARGUMENTS...    # as `VENV/bin/python -m pip install ARGUMENTS...`
#
# OBJMANIFEST_PIP=pip installs with pip alone.
#
# uv (from the package index, into the venv itself) installs in seconds what pip takes most
# of a minute to; pip does it wherever uv cannot (no uv for this platform, or an index that
# only pip's own configuration names: uv does not read pip.conf). Installs run one at a time
# in this tree (CI makes venvs side by side, and an editable build writes
# objmanifest.egg-info here): flock on pyproject.toml, where flock exists.

venv_locked() {
    if command -v flock >/dev/null; then
        flock "$(dirname "${BASH_SOURCE[0]}")/../pyproject.toml" "$@"
    else
        "$@"
    fi
}

venv_pip() {  # pip's own install, quiet but for what goes wrong
    local venv=$1
    shift
    venv_locked "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

pip_into() {
    local venv=$1 said
    shift
    if [ "${OBJMANIFEST_PIP:-}" != pip ] &&
        { [ -x "$venv/bin/uv" ] || venv_pip "$venv" uv 2>/dev/null; }; then
        if said=$(venv_locked "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" \
            "$@" 2>&1); then
            return 0
        fi
        echo "uv could not install (${said##*$'\n'}); pip installs instead" >&2
    fi
    venv_pip "$venv" "$@"
}
