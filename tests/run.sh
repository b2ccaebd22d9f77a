#!/usr/bin/env bash
# Runs every test: dependencies, release build, cargo tests, python integration tests.
#
#   PERCORE_SKIP_CARGO=1   skip `cargo build` / `cargo test` (iterate on the python tests
#                          against an already built target/release/percore)
#   PERCORE_BIN=PATH       server binary for the python tests
#   PYTEST_ARGS="..."      extra pytest arguments (e.g. "-k crash")
#   PERCORE_CRASH_ROUNDS   rounds of the crash-consistency test (default 10)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"

step() { echo; echo "==> $*"; }

step "tools/install-test-deps.sh"
bash tools/install-test-deps.sh

if [ "${PERCORE_SKIP_CARGO:-0}" != "1" ]; then
    # The release build is shared: `cargo test --release` reuses its compiled
    # dependencies, a debug `cargo test` would build them all a second time.
    step "cargo build --release"
    cargo build --release
    step "protocol/generate.sh --check (flatbuffers code matches the schema)"
    bash protocol/generate.sh --check
    step "cargo test --workspace --release"
    cargo test --workspace --release
else
    step "PERCORE_SKIP_CARGO=1: skipping cargo build and cargo test"
fi

target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
export PERCORE_BIN="${PERCORE_BIN:-$target_dir/release/percore}"
if [ ! -x "$PERCORE_BIN" ]; then
    echo "error: server binary $PERCORE_BIN not found (build it or set PERCORE_BIN)" >&2
    exit 1
fi

step "python integration tests (PERCORE_BIN=$PERCORE_BIN)"
# -rfEsxX: summarise failures, errors, skips, xfails and xpasses.
# The hard cap (SIGINT first, so pytest's cleanup kills the servers) keeps a
# hung server from eating the whole CI budget; the suite normally takes a few
# minutes.
# shellcheck disable=SC2086
timeout -s INT -k 60 "${PERCORE_PYTEST_TIMEOUT:-1800}" \
    "$PYTHON" -m pytest tests/python -q -rfEsxX -p no:cacheprovider --durations=10 \
    -o faulthandler_timeout=300 ${PYTEST_ARGS:-}
