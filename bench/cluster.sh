#!/usr/bin/env bash
# Cluster throughput side by side in one run (issue 18): one node (no
# cluster) vs three nodes with R = 1 and with R = 3, on this machine's
# loopback addresses 127.0.0.2-4, with a real etcd:
#   - native PUT and GET of 64 KiB objects through the cluster-aware
#     client (each key sent to its group's primary);
#   - S3 PUT and GET of 64 KiB objects through node 1's door (keys another
#     node leads are forwarded);
#   - server CPU per GB: the CPU time of every node process (all nodes
#     together), per GB moved by the clients;
#   - catch-up rate (R = 3): node 3 killed, objects written while it is
#     down, node 3 restarted: time until it is synced again.
# Every node runs 1 shard; all nodes share CPU 0, the load generator has
# CPU 1 (this machine has 2): the three-node figures are what replication
# costs on one core, not a scaling result (that needs a node per machine).
#   bash bench/cluster.sh [SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECS="${1:-6}"
BIN=target/release/percore
[ -x "$BIN" ] || cargo build --release
command -v etcd > /dev/null || { echo "etcd is not installed (bash tools/install-test-deps.sh)" >&2; exit 1; }
WORK="$(mktemp -d /tmp/percore-bench-cluster.XXXX)"
OUT=bench/results/cluster.md
JSON=bench/results/cluster.jsonl
: > "$JSON"
PIDS=()
ETCD_PID=""
stop_all() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}
cleanup() {
    stop_all
    [ -n "$ETCD_PID" ] && kill "$ETCD_PID" 2>/dev/null && wait "$ETCD_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
export PERCORE_LOG=warn PERCORE_CLUSTER_LEASE_TTL_S=3

ready() { # log
    for _ in $(seq 300); do grep -q "percore: ready" "$1" && return 0; sleep 0.1; done
    echo "node did not start: $(tail -5 "$1")" >&2; exit 1
}

start_etcd() { # port
    rm -rf "$WORK/etcd"
    etcd --name b --data-dir "$WORK/etcd" \
        --listen-client-urls "http://127.0.0.1:$1" --advertise-client-urls "http://127.0.0.1:$1" \
        --listen-peer-urls "http://127.0.0.1:$(($1 + 1))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$(($1 + 1))" \
        --initial-cluster "b=http://127.0.0.1:$(($1 + 1))" > "$WORK/etcd.log" 2>&1 &
    ETCD_PID=$!
    for _ in $(seq 100); do
        etcdctl --endpoints "127.0.0.1:$1" endpoint health > /dev/null 2>&1 && return 0
        ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$1" endpoint health > /dev/null 2>&1 && return 0
        sleep 0.1
    done
}

start_node() { # i urls (i = 1..3)
    local i="$1" ip="127.0.0.$(($1 + 1))"
    mkdir -p "$WORK/n$i"
    taskset -c 0 "$BIN" serve --data "$WORK/n$i" --shards 1 --unpinned \
        --s3 "$ip:19000" --native "$ip:19100" --admin "$ip:19300" \
        --cluster "$2" --node "n$i" --zone "z$i" > "$WORK/n$i.log" 2>&1 &
    PIDS[$i]=$!
    ready "$WORK/n$i.log"
}

synced() { # urls count
    for _ in $(seq 600); do
        [ "$("$BIN" cluster status --cluster "$1" | grep -c ' up .*sync=yes')" = "$2" ] && return 0
        sleep 0.1
    done
    echo "nodes did not sync: $("$BIN" cluster status --cluster "$1")" >&2; exit 1
}

run_rows() { # label native s3 pids
    local b="taskset -c 1 $BIN bench --endpoint $2 --s3 $3 --server-pid $4 --duration $SECS --warmup 1 --threads 1 --json $JSON --size 64K --objects 2000 --concurrency 16"
    $b --mode native --op put --label "$1-native-put" --prefix n/ --header | tee -a "$WORK/rows"
    $b --mode native --op get --label "$1-native-get" --prefix g/ | tee -a "$WORK/rows"
    $b --mode s3 --op put --label "$1-s3-put" --prefix s/ | tee -a "$WORK/rows"
    $b --mode s3 --op get --label "$1-s3-get" --prefix h/ | tee -a "$WORK/rows"
}

: > "$WORK/rows"
# 1. One node, no cluster.
mkdir -p "$WORK/single"
taskset -c 0 "$BIN" serve --data "$WORK/single" --shards 1 --unpinned \
    --s3 127.0.0.1:19000 --native 127.0.0.1:19100 --admin 127.0.0.1:19300 > "$WORK/single.log" 2>&1 &
PIDS[0]=$!
ready "$WORK/single.log"
run_rows single 127.0.0.1:19100 127.0.0.1:19000 "${PIDS[0]}"
stop_all

# 2. and 3. Three nodes, R = 1 then R = 3 (a fresh etcd and data each).
for r in 1 3; do
    rm -rf "$WORK"/n1 "$WORK"/n2 "$WORK"/n3
    PORT=$((23790 + r * 10))
    start_etcd "$PORT"
    URLS="http://127.0.0.1:$PORT"
    "$BIN" cluster init --cluster "$URLS" --replicas "$r" --pgs 256 > /dev/null
    for i in 1 2 3; do start_node "$i" "$URLS"; done
    synced "$URLS" 3
    sleep 1.5 # every node's shards hold the map that says so
    run_rows "3nodes-R$r" 127.0.0.2:19100 127.0.0.2:19000 "${PIDS[1]},${PIDS[2]},${PIDS[3]}"
    if [ "$r" = 3 ]; then
        # Catch-up: node 3 down while 2000 x 64 KiB are written, then back.
        kill -9 "${PIDS[3]}"; wait "${PIDS[3]}" 2>/dev/null || true
        for _ in $(seq 200); do
            "$BIN" cluster status --cluster "$URLS" | grep -q '^n3 down' && break; sleep 0.1
        done
        sleep 1.5 # every node's shards hold the map that says so
        # (boto3: a bucket creation, which the load generator starts
        # with, needs every node that may hold keys, n3 included.)
        taskset -c 1 python3 - <<'PY'
import os, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url="http://127.0.0.2:19000", region_name="us-east-1",
                  aws_access_key_id=os.environ.get("PERCORE_ACCESS_KEY", "percore"),
                  aws_secret_access_key=os.environ.get("PERCORE_SECRET_KEY", "percore-secret"),
                  config=Config(retries={"max_attempts": 10, "mode": "standard"}))
body = os.urandom(64 * 1024)
for i in range(2000):
    s3.put_object(Bucket="bench", Key=f"c/{i:05d}", Body=body)
PY
        t0=$(date +%s.%N)
        start_node 3 "$URLS"
        synced "$URLS" 3
        t1=$(date +%s.%N)
        python3 - "$t0" "$t1" >> "$WORK/catchup" <<'PY'
import sys
s = float(sys.argv[2]) - float(sys.argv[1])
mb = 2000 * 64 / 1024
print(f"- catch-up (R = 3): node 3 killed, 2000 new 64 KiB objects ({mb:.0f} MiB) written while it was down, "
      f"restarted: up and synced {s:.1f} s after its start (process start, join, then the catch-up of "
      f"every group it holds from their primaries), {mb / s:.1f} MiB/s including start and join")
PY
    fi
    stop_all
    kill "$ETCD_PID"; wait "$ETCD_PID" 2>/dev/null || true; ETCD_PID=""
done

{
  echo "# cluster: 1 node vs 3 nodes, R = 1 and R = 3 ($(date -u +%F), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
  echo
  echo "Every node: 1 shard; all server processes on CPU 0, load generator on CPU 1; loopback (127.0.0.2-4); etcd on loopback; 64 KiB objects, 16 in flight."
  echo "Server CPU per GB counts every node process. Command: bash bench/cluster.sh $SECS"
  echo
  cat "$WORK/rows"
  echo
  python3 - "$JSON" <<'PY'
import json, sys
r = {j["label"]: j for j in map(json.loads, open(sys.argv[1]))}
for op in ("native-put", "native-get", "s3-put", "s3-get"):
    base = r.get(f"single-{op}")
    if not base:
        continue
    parts = []
    for cfg in ("3nodes-R1", "3nodes-R3"):
        x = r.get(f"{cfg}-{op}")
        if x:
            parts.append(f"{cfg} {x['units_per_sec']:.0f}/s = {x['units_per_sec'] / max(base['units_per_sec'], 1):.2f}x, "
                         f"server CPU per GB {x.get('server_cpu_seconds_per_gb', 0):.2f} s")
    print(f"- {op}: single node {base['units_per_sec']:.0f}/s (server CPU per GB {base.get('server_cpu_seconds_per_gb', 0):.2f} s); " + "; ".join(parts))
PY
  cat "$WORK/catchup" 2>/dev/null || true
} > "$OUT"
cat "$OUT"
