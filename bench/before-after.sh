#!/usr/bin/env bash
# Two percore binaries side by side: is a change (a refactor, say) within
# noise of the binary before it?
#
#   bash bench/before-after.sh OLD_BINARY [NEW_BINARY] [--repeat N] [--secs S] [--only REGEX]
#
# NEW_BINARY defaults to target/release/percore (built first). Each binary
# serves 1 shard on CPU $SRV_CPU (default 0); the load generator (the NEW
# binary's `percore bench`, one thread, concurrency $CONC) runs on CPU
# $LG_CPU (default 1), over loopback. Rounds alternate old, new, old, new...
# so drift on a shared machine hits both alike. Workloads: S3 GET 64 KiB and
# 1 MiB hot, S3 durable PUT 1 MiB, S3 4 KiB ranges (16 single-range GETs
# per op), native GET 64 KiB hot, native 4 KiB ranges (16 in one request);
# --only keeps the workloads whose name matches REGEX (native rows read
# what the S3 row of the same size prepared: keep both).
#
# Prints one row per workload: median of each binary, the spread (min-max)
# and new/old. Writes the runs to bench/results/before-after.jsonl.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/peers.sh

OLD="" NEW="" REPEAT=3 SECS=4 ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --repeat) REPEAT="$2"; shift ;;
        --secs) SECS="$2"; shift ;;
        --only) ONLY="$2"; shift ;;
        -*) echo "unknown option $1; see the head of $0" >&2; exit 2 ;;
        *) if [ -z "$OLD" ]; then OLD="$1"; else NEW="$1"; fi ;;
    esac
    shift
done
[ -n "$OLD" ] || { echo "usage: $0 OLD_BINARY [NEW_BINARY] [--repeat N] [--secs S]" >&2; exit 2; }
if [ -z "$NEW" ]; then
    cargo build --release -q -p percore-server
    NEW=target/release/percore
fi
SRV_CPU="${SRV_CPU:-0}" LG_CPU="${LG_CPU:-1}" CONC="${CONC:-16}"
AK=percore SK=percore-secret
JSON=bench/results/before-after.jsonl
: > "$JSON"
WORK="$(mktemp -d "${BENCH_DIR:-/var/tmp}/percore-ba.XXXX")"
P=""
cleanup() { [ -n "$P" ] && kill "$P" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# lg LABEL MODE ENDPOINT ARGS...
lg() {
    local label="$1" mode="$2" ep="$3"
    shift 3
    [[ -z "$ONLY" || "${label%%|*}" =~ $ONLY ]] || return 0
    local target=(--s3 "$ep")
    [ "$mode" = native ] && target=(--endpoint "$ep")
    taskset -c "$LG_CPU" "$NEW" bench --mode "$mode" "${target[@]}" --access-key "$AK" \
        --secret-key "$SK" --server-pid "$P" --threads 1 --concurrency "$CONC" \
        --label "$label" --json "$JSON" --duration "$SECS" --warmup 1 "$@" > /dev/null
}

for round in $(seq "$REPEAT"); do
    for which in old new; do
        bin="$OLD"; [ "$which" = new ] && bin="$NEW"
        echo "round $round of $REPEAT: $which ($bin)" >&2
        rm -rf "$WORK/data"
        PERCORE_LOG=warn taskset -c "$SRV_CPU" "$bin" serve --data "$WORK/data" --shards 1 \
            --cpus "$SRV_CPU" --s3 127.0.0.1:19830 --native 127.0.0.1:19831 \
            --admin 127.0.0.1:19832 > "$WORK/server.log" 2>&1 &
        P=$!
        wait_port 127.0.0.1:19830
        lg "get-64K-hot|$which" s3 127.0.0.1:19830 --op get --size 64K --objects 1000 --prefix g64k/
        lg "get-1M-hot|$which" s3 127.0.0.1:19830 --op get --size 1M --objects 256 --prefix g1m/
        lg "range-4K|$which" s3 127.0.0.1:19830 --op range --ranges 16 --range-size 4K \
            --large-size 64M --prefix r/
        lg "native-get-64K-hot|$which" native 127.0.0.1:19831 --op get --size 64K \
            --objects 1000 --prefix g64k/ --no-prepare
        lg "native-range-4K|$which" native 127.0.0.1:19831 --op range --ranges 16 \
            --range-size 4K --large-size 64M --prefix r/ --no-prepare
        # Writes last: their writeback and compaction would slow the reads
        # that follow them, and not equally from run to run.
        lg "put-1M|$which" s3 127.0.0.1:19830 --op put --size 1M --prefix p/
        kill "$P"; wait "$P" 2>/dev/null || true; P=""
        # The next server starts on a quiet disk.
        rm -rf "$WORK/data"; sync
    done
done

python3 - "$JSON" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    w, _, which = r["label"].partition("|")
    runs.setdefault(w, {}).setdefault(which, []).append(r)
def fig(r):
    return r.get("ops_per_sec", 0.0)
print(f"{'workload':<22} {'old ops/s (min-max)':>28} {'new ops/s (min-max)':>28} {'new/old':>8}")
for w, by in runs.items():
    o = [fig(r) for r in by.get("old", [])]
    n = [fig(r) for r in by.get("new", [])]
    if not o or not n:
        continue
    mo, mn = statistics.median(o), statistics.median(n)
    print(f"{w:<22} {mo:>10.0f} ({min(o):>7.0f}-{max(o):>7.0f}) {mn:>10.0f} ({min(n):>7.0f}-{max(n):>7.0f}) {mn / mo:>8.3f}")
PY
