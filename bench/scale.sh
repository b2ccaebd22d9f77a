#!/usr/bin/env bash
# percore shard scaling: the same workloads with 1, 2, 4 ... N shards.
#
#   bash bench/scale.sh [--shards "1 2 4"] [--server-cpus LIST] [--client-cpus LIST]
#                       [--secs S] [--json FILE]
#
# On a machine with a CPU per shard (the case that matters), give the server
# and the load generator disjoint CPU lists, e.g. on 32 cores:
#   bash bench/scale.sh --shards "1 2 4 8 16" --server-cpus 0-15 --client-cpus 16-31
# Shards are then pinned to the first N CPUs of --server-cpus (one each),
# the load generator runs one thread per client CPU and 16 connections per
# shard. When there are fewer server CPUs than shards (this 2-CPU machine:
# all shards on CPU 0), shards run unpinned inside the server CPU set: the
# rows then measure what sharding costs on a fixed CPU budget, not scaling.
#
# Workloads: 64 KiB GETs (hot), durable 1 MiB PUTs, 100k-key LIST pages,
# native BatchGet of 64 x 16 KiB. Prints one table row per run; with --json,
# appends JSON lines labelled "scale-<workload>|percore-<N>sh".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SHARDS="1 2 4" SRV="0" CLI="1" SECS=5 JSON=""
while [ $# -gt 0 ]; do
    case "$1" in
        --shards) SHARDS="$2"; shift 2 ;;
        --server-cpus) SRV="$2"; shift 2 ;;
        --client-cpus) CLI="$2"; shift 2 ;;
        --secs) SECS="$2"; shift 2 ;;
        --json) JSON="$2"; shift 2 ;;
        *) echo "unknown option $1; see the head of $0"; exit 2 ;;
    esac
done
BIN=target/release/percore
[ -x "$BIN" ] || cargo build --release -q -p percore-server
cpus_of() { # expand 0-3,8 into "0 1 2 3 8"
    local out=() part
    IFS=, read -ra parts <<< "$1"
    for part in "${parts[@]}"; do
        if [[ "$part" == *-* ]]; then out+=($(seq "${part%-*}" "${part#*-}")); else out+=("$part"); fi
    done
    echo "${out[@]}"
}
SRV_LIST=($(cpus_of "$SRV"))
CLI_N=$(cpus_of "$CLI" | wc -w)
JSON_ARG=()
[ -n "$JSON" ] && JSON_ARG=(--json "$JSON")
WORK="$(mktemp -d "${BENCH_DIR:-/var/tmp}/percore-scale.XXXX")"
P=""
trap '[ -n "$P" ] && kill $P 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
echo "| shards | workload | units/s | MB/s | p50 ms | p99 ms | server CPU µs/unit |"
echo "|---|---|---|---|---|---|---|"
for n in $SHARDS; do
    rm -rf "$WORK/data"
    if [ "$n" -le "${#SRV_LIST[@]}" ]; then
        pin=(--cpus "$(echo "${SRV_LIST[@]:0:$n}" | tr ' ' ,)")
        run=()
    else
        pin=(--unpinned)
        run=(taskset -c "$SRV")
    fi
    PERCORE_LOG=warn "${run[@]}" "$BIN" serve --data "$WORK/data" --shards "$n" "${pin[@]}" \
        --s3 127.0.0.1:19850 --native 127.0.0.1:19860 --admin 127.0.0.1:19849 > "$WORK/log" 2>&1 &
    P=$!
    for _ in $(seq 100); do grep -q "percore: ready" "$WORK/log" && break; sleep 0.1; done
    conc=$((16 * n))
    b() { # workload mode args...
        local w="$1" mode="$2"
        shift 2
        taskset -c "$CLI" "$BIN" bench --mode "$mode" --s3 127.0.0.1:19850 \
            --endpoint 127.0.0.1:19860 --server-pid "$P" --threads "$CLI_N" \
            --concurrency "$conc" --duration "$SECS" --warmup 1 \
            --label "scale-$w|percore-${n}sh" "${JSON_ARG[@]}" "$@" 2> /dev/null |
            awk -F'|' -v n="$n" -v w="$w" '{printf "| %s | %s | %s | %s | %s | %s | %s |\n", n, w, $7, $8, $9, $11, $15}'
    }
    b get-64K s3 --op get --size 64K --objects 2000 --prefix g/
    b put-1M s3 --op put --size 1M --prefix p/
    b list-100k s3 --op list --size 0 --objects 100000 --prefix l/
    b batch-64x16K native --op batch --batch 64 --size 16K --objects 5000 --prefix s/
    kill "$P"
    wait "$P" 2>/dev/null || true
    P=""
done
