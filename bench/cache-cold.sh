#!/usr/bin/env bash
# Cold GETs with percore's object cache off and on, same binary, alternating:
# does the cache cost cold reads anything (lookups, ghost keys, copies)?
#
#   bash bench/cache-cold.sh [ROUNDS]    (default 2)
#
# One shard on CPU $SRV_CPU (default 0), `percore bench` on CPU $LG_CPU
# (default 1). Per round and setting: load 2000 x 64 KiB and 5000 x 10 KiB,
# drop the page cache and the object cache (POST /cache/drop), read every
# object once (--each-once). Prints one table row per run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROUNDS="${1:-2}" SRV_CPU="${SRV_CPU:-0}" LG_CPU="${LG_CPU:-1}"
cargo build --release -q -p percore-server
BIN=target/release/percore
for _ in $(seq "$ROUNDS"); do
    for mb in 0 1024; do
        work="$(mktemp -d "${BENCH_DIR:-/var/tmp}/percore-cache-cold.XXXX")"
        PERCORE_LOG=warn "$BIN" serve --data "$work/d" --shards 1 --cpus "$SRV_CPU" \
            --object-cache-mb "$mb" --s3 127.0.0.1:19950 --native 127.0.0.1:19951 \
            --admin 127.0.0.1:19952 > "$work/log" 2>&1 &
        pid=$!
        for _ in $(seq 100); do
            curl -sf 127.0.0.1:19952/health/ready > /dev/null && break
            sleep 0.1
        done
        for set in "64K 2000 g64k/" "10K 5000 g10k/"; do
            read -r size n prefix <<< "$set"
            taskset -c "$LG_CPU" "$BIN" bench --mode s3 --s3 127.0.0.1:19950 --op get \
                --size "$size" --objects "$n" --prefix "$prefix" --duration 1 --warmup 0 \
                --threads 1 --no-progress > /dev/null
            sync
            echo 3 > /proc/sys/vm/drop_caches
            curl -sf -X POST -H "Authorization: Bearer percore-secret" \
                http://127.0.0.1:19952/cache/drop > /dev/null
            taskset -c "$LG_CPU" "$BIN" bench --mode s3 --s3 127.0.0.1:19950 --op get \
                --size "$size" --objects "$n" --prefix "$prefix" --each-once --no-prepare \
                --duration 60 --warmup 0 --server-pid "$pid" --threads 1 --no-progress \
                --label "cold-$size-cache-${mb}MiB" | tail -1
        done
        kill "$pid"
        wait "$pid" 2> /dev/null || true
        rm -rf "$work"
    done
done
