#!/usr/bin/env bash
# Native protocol vs S3 on the same server, side by side in one run:
#   1. 4 KiB reads at random offsets of a 256 MiB object: native Get with 16
#      ranges per request vs S3 single-range GETs (unit = one 4 KiB range);
#   2. 64 x 16 KiB samples: native BatchGet vs 64 S3 GETs (unit = one sample).
# Server pinned to CPU 0, load generator to CPU 1 (taskset); server CPU per
# unit from /proc. Writes bench/results/native.md.
#   bash bench/native.sh [SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECS="${1:-8}"
BIN=target/release/percore
[ -x "$BIN" ] || cargo build --release
DATA="$(mktemp -d /tmp/percore-bench-native.XXXX)"
S3=127.0.0.1:19500; NATIVE=127.0.0.1:19600; ADMIN=127.0.0.1:19700
PERCORE_LOG=warn taskset -c 0 "$BIN" serve --data "$DATA" --shards 1 --unpinned \
    --s3 $S3 --native $NATIVE --admin $ADMIN > "$DATA.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DATA" "$DATA.log"' EXIT
for _ in $(seq 100); do grep -q "percore: ready" "$DATA.log" && break; sleep 0.1; done
OUT=bench/results/native.md
JSON=bench/results/native.jsonl
: > "$JSON"
B="taskset -c 1 $BIN bench --endpoint $NATIVE --s3 $S3 --server-pid $PID --duration $SECS --warmup 2 --threads 1 --json $JSON"
{
  echo "# native protocol vs S3 ($(date -u +%F), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
  echo
  echo "Server: 1 shard on CPU 0; load generator on CPU 1; loopback. unit = one 4 KiB range (range) or one 16 KiB sample (batch)."
  echo "Command: bash bench/native.sh $SECS"
  echo
} > "$OUT"
row() { $B "$@" | tee -a "$OUT.rows"; }
: > "$OUT.rows"
row --mode native --op range --ranges 16 --range-size 4K --large-size 256M --concurrency 16 --label native-range-16x4K --header
row --mode s3 --op range --ranges 16 --range-size 4K --large-size 256M --concurrency 16 --no-prepare --label s3-range-4K
row --mode native --op batch --batch 64 --objects 5000 --size 16K --concurrency 8 --prefix s/ --label native-batch-64x16K
row --mode s3 --op batch --batch 64 --objects 5000 --size 16K --concurrency 32 --prefix s/ --no-prepare --label s3-64-GETs-16K
cat "$OUT.rows" >> "$OUT"; rm -f "$OUT.rows"
python3 - "$JSON" >> "$OUT" <<'PY'
import json, sys
r = {j["label"]: j for j in map(json.loads, open(sys.argv[1]))}
def ratio(a, b, what):
    x, y = r[a], r[b]
    print(f"- {what}: native {x['units_per_sec']:.0f}/s vs S3 {y['units_per_sec']:.0f}/s = {x['units_per_sec']/max(y['units_per_sec'],1):.2f}x; "
          f"server CPU per unit {x['server_cpu_us_per_unit']:.1f} vs {y['server_cpu_us_per_unit']:.1f} µs = {y['server_cpu_us_per_unit']/max(x['server_cpu_us_per_unit'],1e-9):.2f}x less")
print()
ratio("native-range-16x4K", "s3-range-4K", "4 KiB random ranges")
ratio("native-batch-64x16K", "s3-64-GETs-16K", "16 KiB samples")
PY
cat "$OUT"
