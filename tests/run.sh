#!/usr/bin/env bash
# Runs every test: dependencies, release build, cargo tests, python integration tests.
#
#   PERCORE_SKIP_CARGO=1   skip `cargo build` / lint / `cargo test` (iterate on the python tests
#                          against an already built target/release/percore)
#   PERCORE_BIN=PATH       server binary for the python tests
#   PYTEST_ARGS="..."      extra pytest arguments (e.g. "-k crash")
#   PERCORE_CRASH_ROUNDS   rounds of the crash-consistency test (default 10)
#   PERCORE_CI_NO_SKIPS    1 (default): a skipped python test fails the run unless it
#                          is on SKIP_ALLOW_LIST in tests/python/conftest.py; 0 to allow
#                          skips (a developer machine without loop devices, say)
#
# At the end (also when a phase fails) it prints each phase's duration.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"

export PERCORE_CI_NO_SKIPS="${PERCORE_CI_NO_SKIPS:-1}"

step() { echo; echo "==> $*"; }

# Phase timings: `phase NAME` starts a phase (ending the one before);
# the table is printed on every exit, so a failing run shows where it stopped.
PHASES=()
PHASE_NAME=""
PHASE_START=0
RUN_START=$SECONDS
phase_end() {
    local status="$1"
    if [ -n "$PHASE_NAME" ]; then
        PHASES+=("$(printf '%-34s %6ss  %s' "$PHASE_NAME" "$((SECONDS - PHASE_START))" "$status")")
        PHASE_NAME=""
    fi
}
phase() {
    phase_end ok
    PHASE_NAME="$1"
    PHASE_START=$SECONDS
    step "$1"
}
print_phases() {
    local rc=$?
    phase_end "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
    echo
    echo "==> phase durations"
    printf '%-34s %7s  %s\n' "phase" "time" "result"
    local line
    for line in "${PHASES[@]}"; do
        echo "$line"
    done
    printf '%-34s %6ss  %s\n' "total" "$((SECONDS - RUN_START))" "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
    exit "$rc"
}
trap print_phases EXIT

phase "deps: tools/install-test-deps.sh"
bash tools/install-test-deps.sh

if [ "${PERCORE_SKIP_CARGO:-0}" != "1" ]; then
    # The release build is shared: `cargo test --release` reuses its compiled
    # dependencies, a debug `cargo test` would build them all a second time.
    phase "cargo build --release"
    cargo build --release
    phase "generate: protocol/generate.sh --check"
    bash protocol/generate.sh --check
    # Lint: formatting and clippy, warnings are errors (reuses the check
    # builds of the dependencies, a few minutes on a fresh machine).
    phase "lint: cargo fmt --check"
    cargo fmt --all --check
    phase "lint: cargo clippy -D warnings"
    cargo clippy --workspace --all-targets -- -D warnings
    phase "cargo test --workspace --release"
    cargo test --workspace --release
else
    phase_end ok
    step "PERCORE_SKIP_CARGO=1: skipping cargo build and cargo test"
    PHASES+=("$(printf '%-34s %7s  %s' "cargo build / generate / test" "-" "skipped (PERCORE_SKIP_CARGO=1)")")
fi

# The Python package (tools/python: maturin builds the PyO3 extension into
# the workspace's target dir, reusing the release build's dependencies).
phase "python package: pip install ./tools/python"
bash tools/python/install.sh

phase "python tests"
target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
export PERCORE_BIN="${PERCORE_BIN:-$target_dir/release/percore}"
if [ ! -x "$PERCORE_BIN" ]; then
    echo "error: server binary $PERCORE_BIN not found (build it or set PERCORE_BIN)" >&2
    exit 1
fi

echo "PERCORE_BIN=$PERCORE_BIN PERCORE_CI_NO_SKIPS=$PERCORE_CI_NO_SKIPS"
# -rfEsxX: summarise failures, errors, skips, xfails and xpasses.
# The hard cap (SIGINT first, so pytest's cleanup kills the servers) keeps a
# hung server from eating the whole CI budget; the suite normally takes a few
# minutes.
# shellcheck disable=SC2086
timeout -s INT -k 60 "${PERCORE_PYTEST_TIMEOUT:-1800}" \
    "$PYTHON" -m pytest tests/python -q -rfEsxX -p no:cacheprovider --durations=10 \
    -o faulthandler_timeout=300 ${PYTEST_ARGS:-}
