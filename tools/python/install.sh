#!/usr/bin/env bash
# Builds and installs the `percore` Python package from this checkout
# (maturin from PyPI, the Rust toolchain already here). Safe to rerun: it
# reinstalls from the current sources.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
PYTHON="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
pip_install() {
    if ! "$PYTHON" -m pip install -q "$@"; then
        echo "install.sh: retrying with --break-system-packages (externally managed python)"
        "$PYTHON" -m pip install -q --break-system-packages "$@"
    fi
}
if ! "$PYTHON" -c "import maturin" >/dev/null 2>&1; then
    pip_install "maturin>=1.5,<2"
fi
# --no-build-isolation: use the maturin above instead of fetching one per build.
pip_install --no-build-isolation --force-reinstall --no-deps .
"$PYTHON" -c "import percore, sys; print('install.sh: percore', percore.__file__, file=sys.stderr)"
