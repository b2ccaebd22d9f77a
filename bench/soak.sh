#!/usr/bin/env bash
# Long soak: tests/python/test_soak.py with long phases (default 3 x 300 s),
# samples of RSS and open descriptors to bench/results/soak.csv, summary on
# stdout.  bash bench/soak.sh [SECONDS_PER_PHASE]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release -q -p percore-server
PERCORE_SOAK_SECONDS="${1:-300}" PERCORE_SOAK_CSV="$PWD/bench/results/soak.csv" \
    python3 -m pytest -q -s tests/python/test_soak.py -p no:cacheprovider
echo "samples: bench/results/soak.csv"
