#!/usr/bin/env bash
# Random ranges and streams from the device, side by side with fio (issue 17,
# goals 3 and 4):
#
#   bash bench/ranges.sh [REPEAT]    (default 3; medians are reported)
#
# - fio 4 KiB randread, O_DIRECT, io_uring, iodepth 16 and 1, on a 1 GiB file
#   in the same directory: the device's ceiling.
# - percore, native Get of 16 random 4 KiB ranges of a 256 MiB object,
#   1 connection (a device queue depth of 16 when the ranges of a Get are
#   read together) and 16 connections; with the default windows (the ranges
#   of a Get read at once) and with PERCORE_GET_WINDOW_PIECES=1 (one range
#   after the other, as before).
# - the same with the 16 ranges in runs of 8 adjacent ones (rows of a
#   column chunk): default merging (one device read per run) and
#   PERCORE_READ_MERGE_BYTES=0 (one device read per range).
# - whole 64 MiB objects streamed on 1 connection: windows (1 MiB: a stream
#   goes one chunk at a time either way, so this row checks that windows
#   cost a stream nothing; with 4 MiB windows, rev ed94c0f, it measured
#   0.86x: bench/results/ranges-issue17-window4m.md).
#
# The object cache is off (--object-cache-mb 0), so every byte comes from the
# device; 4 KiB ranges never enter it anyway (only whole parts do). One shard
# on CPU $SRV_CPU (default 0), fio and the server there, `percore bench` on
# CPU $LG_CPU (default 1). Results: bench/results/ranges.{json,md} (--out NAME
# changes the name).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPEAT=3 OUT=ranges SECS="${SECS:-5}"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift ;;
        [0-9]*) REPEAT="$1" ;;
        *) echo "usage: bash bench/ranges.sh [REPEAT] [--out NAME]" >&2; exit 2 ;;
    esac
    shift
done
SRV_CPU="${SRV_CPU:-0}" LG_CPU="${LG_CPU:-1}"
command -v fio > /dev/null || { apt-get install -y -qq fio > /dev/null; }
cargo build --release -q -p percore-server
BIN=target/release/percore
WORK="$(mktemp -d "${BENCH_DIR:-/var/tmp}/percore-ranges.XXXX")"
JSON="$WORK/rows.json"
PID=""
cleanup() {
    [ -n "$PID" ] && kill "$PID" 2> /dev/null && wait "$PID" 2> /dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

fio_row() { # name iodepth
    taskset -c "$SRV_CPU" fio --name="$1" --filename="$WORK/fio.dat" --size=1G --direct=1 \
        --ioengine=io_uring --rw=randread --bs=4K --iodepth="$2" --runtime="$SECS" \
        --time_based --output-format=json > "$WORK/fio.json"
    python3 - "$WORK/fio.json" "$1" >> "$JSON" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["read"]
print(json.dumps({"label": sys.argv[2], "units_per_sec": j["iops"], "mb_per_sec": j["bw_bytes"] / 1e6,
                  "server_cpu_us_per_unit": 0}))
PY
}

start() { # env assignments for the server
    env "$@" PERCORE_LOG=warn "$BIN" serve --data "$WORK/d" --shards 1 --cpus "$SRV_CPU" \
        --object-cache-mb 0 --s3 127.0.0.1:19960 --native 127.0.0.1:19961 \
        --admin 127.0.0.1:19962 >> "$WORK/log" 2>&1 &
    PID=$!
    for _ in $(seq 200); do
        curl -sf 127.0.0.1:19962/health/ready > /dev/null && return
        sleep 0.1
    done
    echo "percore did not start: see $WORK/log" >&2
    exit 1
}

stop() {
    kill "$PID"
    wait "$PID" 2> /dev/null || true
    PID=""
}

lg() { # label args...
    local label="$1"
    shift
    taskset -c "$LG_CPU" "$BIN" bench --mode native --endpoint 127.0.0.1:19961 --threads 1 \
        --server-pid "$PID" --no-progress --duration "$SECS" --warmup 1 --label "$label" \
        --json "$JSON" "$@" > /dev/null
}

# The data, once: a 256 MiB object for ranges, 8 x 64 MiB for streams.
start
lg prepare --op range --large-size 256M --prefix r/ --ops 1 --concurrency 1
lg prepare --op get --size 64M --objects 8 --prefix s/ --ops 1 --concurrency 1
stop
: > "$JSON"

for _ in $(seq "$REPEAT"); do
    fio_row "fio randread 4K qd16" 16
    fio_row "fio randread 4K qd1" 1
    for setting in "windows" "one piece at a time" "no merging"; do
        case "$setting" in
            windows) start ;;
            "one piece at a time") start PERCORE_GET_WINDOW_PIECES=1 ;;
            "no merging") start PERCORE_READ_MERGE_BYTES=0 ;;
        esac
        if [ "$setting" != "no merging" ]; then
            lg "16 random 4K ranges, c=1|$setting" --op range --ranges 16 --range-size 4K \
                --large-size 256M --prefix r/ --no-prepare --concurrency 1
            lg "16 random 4K ranges, c=16|$setting" --op range --ranges 16 --range-size 4K \
                --large-size 256M --prefix r/ --no-prepare --concurrency 16
            lg "64 MiB objects whole, c=1|$setting" --op get --size 64M --objects 8 \
                --prefix s/ --no-prepare --concurrency 1
        fi
        if [ "$setting" != "one piece at a time" ]; then
            lg "16 4K ranges in runs of 8, c=1|$setting" --op range --ranges 16 \
                --range-size 4K --range-run 8 --large-size 256M --prefix r/ --no-prepare \
                --concurrency 1
        fi
        stop
    done
done

mkdir -p bench/results
cp "$JSON" "bench/results/$OUT.json"
python3 - "$JSON" "$REPEAT" "$(git rev-parse --short HEAD)" > "bench/results/$OUT.md" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
med = lambda label, k: statistics.median(x[k] for x in by[label]) if label in by else float("nan")
fio16 = med("fio randread 4K qd16", "units_per_sec")
fio1 = med("fio randread 4K qd1", "units_per_sec")
print(f"# Ranges and streams from the device (bench/ranges.sh, rev {sys.argv[3]})\n")
print(f"Medians of {sys.argv[2]} runs; 1 shard, object cache off; fio on the same disk.\n")
print("| workload | setting | ranges or MB/s | server CPU µs/unit | ratio |")
print("|---|---|---|---|---|")
print(f"| fio randread 4K, iodepth 16 | | {fio16:,.0f} IOPS | | 1.00 |")
print(f"| fio randread 4K, iodepth 1 | | {fio1:,.0f} IOPS | | |")
for label in sorted(by):
    if label.startswith("fio") or "|" not in label:
        continue
    work, setting = label.split("|", 1)
    cpu = med(label, "server_cpu_us_per_unit")
    if "whole" in work:
        mbs = med(label, "mb_per_sec")
        base = med(work + "|one piece at a time", "mb_per_sec")
        print(f"| {work} | {setting} | {mbs:,.0f} MB/s | {cpu:,.1f} | {mbs / base:.2f}× one piece |")
    else:
        ups = med(label, "units_per_sec")
        print(f"| {work} | {setting} | {ups:,.0f} ranges/s | {cpu:,.1f} | {ups / fio16:.2f}× fio qd16 |")
PY
cat "bench/results/$OUT.md"
