#!/usr/bin/env bash
# Runs every cargo-fuzz target (or the ones named) for a set time each and
# prints executions, corpus growth and findings per target.
#
#   bash fuzz/run.sh [--seconds N] [--minimize] [TARGET...]
#
#   --seconds N   time per target (default 60)
#   --minimize    `cargo fuzz cmin` each corpus afterwards (commit the result)
#
# Uses nightly when rustup has it; otherwise the stable toolchain with
# RUSTC_BOOTSTRAP=1 (cargo-fuzz needs -Z flags; the sanitizer runtimes ship
# with stable too). Installs cargo-fuzz when it is missing. A crash leaves its
# input in fuzz/artifacts/<target>/ and makes this script exit 1: fix it,
# then copy the input into fuzz/corpus/<target>/ so CI replays it for ever.
# Summary lines also go to fuzz/artifacts/summary.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

SECONDS_PER=60 MIN=0 TARGETS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) SECONDS_PER="$2"; shift 2 ;;
        --minimize) MIN=1; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        -*) echo "unknown option $1; see the head of $0" >&2; exit 2 ;;
        *) TARGETS+=("$1"); shift ;;
    esac
done
[ ${#TARGETS[@]} -gt 0 ] || mapfile -t TARGETS < <(ls fuzz_targets | sed 's/\.rs$//')

if ! cargo fuzz --help >/dev/null 2>&1; then
    echo "cargo-fuzz not found: cargo install cargo-fuzz --locked (a few minutes)"
    cargo install cargo-fuzz --locked
fi
TOOLCHAIN=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    TOOLCHAIN=(+nightly)
else
    echo "no nightly toolchain: using stable with RUSTC_BOOTSTRAP=1"
    export RUSTC_BOOTSTRAP=1
fi

mkdir -p artifacts
SUMMARY=artifacts/summary.md
{
    echo "# fuzz run $(date -u '+%Y-%m-%d %H:%M UTC'), ${SECONDS_PER} s per target, $(git rev-parse --short HEAD 2>/dev/null)"
    echo
    echo "| target | executions | exec/s | corpus before | corpus after | coverage (cov) | findings |"
    echo "|---|---|---|---|---|---|---|"
} > "$SUMMARY"

failed=0
for t in "${TARGETS[@]}"; do
    [ -f "fuzz_targets/$t.rs" ] || { echo "no target $t (fuzz_targets/$t.rs)" >&2; exit 2; }
    mkdir -p "corpus/$t" "artifacts/$t"
    before=$(ls "corpus/$t" | wc -l)
    found_before=$(ls "artifacts/$t" | wc -l)
    log="artifacts/$t.log"
    echo "== $t: ${SECONDS_PER} s (corpus: $before inputs)"
    # -print_final_stats gives stat::number_of_executed_units; the corpus
    # grows in place (new inputs land in corpus/$t).
    rc=0
    cargo "${TOOLCHAIN[@]}" fuzz run "$t" "corpus/$t" -- -max_total_time="$SECONDS_PER" \
        -print_final_stats=1 -timeout=10 -rss_limit_mb=4096 > "$log" 2>&1 || rc=$?
    execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log" | tail -1)
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
    after=$(ls "corpus/$t" | wc -l)
    findings=$(( $(ls "artifacts/$t" | wc -l) - found_before ))
    if [ "$rc" != 0 ]; then
        failed=1
        [ "$findings" -gt 0 ] || findings="run failed (rc $rc)"
        echo "   FAILED: see fuzz/$log and fuzz/artifacts/$t/" >&2
        tail -30 "$log" >&2
    fi
    rate="-"
    [ -n "$execs" ] && rate=$((execs / SECONDS_PER))
    line="| $t | ${execs:-?} | $rate | $before | $after | ${cov:-?} | $findings |"
    echo "   $line"
    echo "$line" >> "$SUMMARY"
    if [ "$MIN" = 1 ] && [ "$rc" = 0 ]; then
        cargo "${TOOLCHAIN[@]}" fuzz cmin "$t" "corpus/$t" > "artifacts/$t.cmin.log" 2>&1
        echo "   minimized: $(ls "corpus/$t" | wc -l) inputs"
    fi
done
echo
cat "$SUMMARY"
exit "$failed"
