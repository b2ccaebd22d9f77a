#!/usr/bin/env bash
# percore against its peers, side by side, in one run: the one command.
#
#   bash bench/compare.sh [--quick] [--repeat N] [--no-cold] [--no-scale]
#                         [--peers "nginx garage s3s-fs"] [--only REGEX] [--out NAME]
#
# --peers picks the peers to run (default all three); --only runs the
# workloads whose name matches REGEX (e.g. 'get-(10K|64K)'); --out writes
# bench/results/NAME.md (default compare) so a partial run does not
# replace the full table.
#
# Every run is repeated N times (default 3, --quick 1), interleaved with
# nothing else; the report shows the median run and the spread.
#
# Servers, each alone on CPU $SRV_CPU (default 0), load generator
# (`percore bench`, one thread) on CPU $LG_CPU (default 1), loopback:
#   percore     1 shard, S3 endpoint (SigV4) and native protocol rows
#   nginx       static files, sendfile on (the raw-HTTP ceiling; GET only)
#   Garage      single node, lmdb, data and metadata fsync on
#   s3s-fs      the s3s crate's file-system server (no fsync: not durable)
# Ceilings: iperf3 over loopback, fio with O_DIRECT on the same file system.
# Workloads: GET 10 KiB / 64 KiB / 1 MiB hot (random picks after warm-up)
# and cold (page cache dropped, every object read once); durable 1 MiB PUT;
# 4 KiB random ranges in a 256 MiB object; LIST of $LIST_KEYS keys
# (1000-key pages); mixed 45% get, 30% stat, 15% put, 10% delete (64 KiB).
# Then percore's shard scaling (bench/scale.sh).
#
# Writes bench/results/compare.md (tables, ratios, machine, commands),
# compare.jsonl (every run) and compare-<workload>.svg (one plot each).
# Peers are built once into $PEERS (bench/peers.sh install), never in CI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source bench/peers.sh

SECS=5 WARM=1 COLD=1 SCALE=1 REPEAT=3 PEER_SET="nginx garage s3s-fs" ONLY="" OUT=compare
ARGS="$*"
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) SECS=2 WARM=0.5 REPEAT=1 ;;
        --repeat) REPEAT="$2"; shift ;;
        --no-cold) COLD=0 ;;
        --no-scale) SCALE=0 ;;
        --peers) PEER_SET="$2"; shift ;;
        --only) ONLY="$2"; shift ;;
        --out) OUT="$2"; shift ;;
        *) echo "unknown option $1; see the head of $0"; exit 2 ;;
    esac
    shift
done
SRV_CPU="${SRV_CPU:-0}" LG_CPU="${LG_CPU:-1}"
LIST_KEYS="${LIST_KEYS:-100000}"
CONC="${CONC:-16}"

wants() { [[ " $PEER_SET " == *" $1 "* ]]; }
{ ! wants garage || [ -x "$PEERS/bin/garage" ]; } && { ! wants s3s-fs || [ -x "$PEERS/bin/s3s-fs" ]; } &&
    { ! wants nginx || command -v nginx >/dev/null; } && command -v fio >/dev/null &&
    command -v iperf3 >/dev/null || peers_install
cargo build --release -q -p percore-server
# The revision the measured binary was built from (edits made while the run
# goes on must not relabel it).
REV="$(git describe --always --dirty 2>/dev/null || echo unknown)"
BIN=target/release/percore
RES=bench/results
JSON=$RES/$OUT.jsonl
: > "$JSON"
WORK="$(mktemp -d "${BENCH_DIR:-/var/tmp}/percore-compare.XXXX")"
STOP=":"
cleanup() { eval "$STOP" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
log() { printf '\n== %s\n' "$*" >&2; }

drop_caches() {
    sync
    if ! echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
        echo "cannot drop the page cache (not root?): cold rows are skipped" >&2
        return 1
    fi
}

# lg SERVER WORKLOAD MODE ENDPOINT ARGS...: $REPEAT load-generator runs
# (the first prepares the objects unless ARGS say --no-prepare). With
# COLD_RUN=1 the page cache is dropped before each.
lg() {
    local server="$1" workload="$2" mode="$3" ep="$4"
    shift 4
    local target=(--s3 "$ep") args=("$@") rep
    if [ -n "$ONLY" ] && ! [[ "$workload" =~ $ONLY ]]; then
        return 0
    fi
    [ "$mode" = native ] && target=(--endpoint "$ep")
    for rep in $(seq "$REPEAT"); do
        echo "  $workload / $server (run $rep of $REPEAT)" >&2
        if [ "${COLD_RUN:-0}" = 1 ]; then
            drop_caches || return 0
            # percore's own object cache too (the page cache holds none of
            # its data: segments are read with O_DIRECT).
            if [[ "$server" == percore* ]]; then
                curl -sf -X POST -H "Authorization: Bearer $SK" \
                    "http://127.0.0.1:19812/cache/drop" > /dev/null ||
                    { echo "  could not drop percore's object cache" >&2; return 0; }
            fi
        fi
        taskset -c "$LG_CPU" "$BIN" bench --mode "$mode" "${target[@]}" --access-key "$AK" \
            --secret-key "$SK" --server-pid "$PIDS" --threads 1 --concurrency "$CONC" \
            --label "$workload|$server" --json "$JSON" "${args[@]}" > /dev/null ||
            echo "  ($workload / $server failed: see above)" >&2
        [[ " ${args[*]} " == *" --no-prepare "* ]] || args+=(--no-prepare)
    done
}

GET_SETS=("10K 5000 g10k/" "64K 2000 g64k/" "1M 512 g1m/")

# workloads SERVER MODE ENDPOINT CAPS: every workload the server supports.
# CAPS: words among put list mixed (get and range always run).
workloads() {
    local server="$1" mode="$2" ep="$3" caps="$4" prep=()
    # nginx serves files written beforehand; the others are filled over S3.
    [ "$server" = nginx ] && prep=(--no-prepare)
    for set in "${GET_SETS[@]}"; do
        read -r size n prefix <<< "$set"
        local first=("${prep[@]}")
        # Native rows read what the S3 row of the same server uploaded.
        [ "$mode" = native ] && first=(--no-prepare)
        lg "$server" "get-$size-hot" "$mode" "$ep" --op get --size "$size" --objects "$n" \
            --prefix "$prefix" --duration "$SECS" --warmup "$WARM" "${first[@]}"
        if [ "$COLD" = 1 ]; then
            COLD_RUN=1 lg "$server" "get-$size-cold" "$mode" "$ep" --op get --size "$size" \
                --objects "$n" --prefix "$prefix" --each-once --no-prepare --duration 60 --warmup 0
        fi
    done
    local rprep=("${prep[@]}")
    [ "$mode" = native ] && rprep=(--no-prepare)
    lg "$server" "range-4K" "$mode" "$ep" --op range --ranges 16 --range-size 4K \
        --large-size 256M --prefix r/ --duration "$SECS" --warmup "$WARM" "${rprep[@]}"
    if [[ " $caps " == *" put "* ]]; then
        lg "$server" "put-1M" "$mode" "$ep" --op put --size 1M --prefix "p-$mode/" \
            --duration "$SECS" --warmup "$WARM"
    fi
    if [[ " $caps " == *" mixed "* ]]; then
        lg "$server" "mixed-64K" "$mode" "$ep" --op mixed --size 64K --objects 2000 \
            --prefix g64k/ --no-prepare --duration "$SECS" --warmup "$WARM"
    fi
    if [[ " $caps " == *" list "* ]]; then
        local lp=()
        [ "$mode" = native ] && lp=(--no-prepare)
        lg "$server" "list-$((LIST_KEYS / 1000))k" "$mode" "$ep" --op list --size 0 \
            --objects "$LIST_KEYS" --prefix l/ --duration "$SECS" --warmup "$WARM" "${lp[@]}"
    fi
}

# peer_workloads NAME CAPS: the workloads against the peer just started
# (start_* set PEER_*), then stop it.
peer_workloads() {
    STOP="$PEER_STOP"
    PIDS="$PEER_PIDS"
    workloads "$1" s3 "$PEER_ENDPOINT" "$2"
    eval "$STOP" || true # a server killed by SIGTERM exits 143
    STOP=":"
}

# ---- ceilings ----
log "loopback ceiling: iperf3 ($SECS s, server CPU $SRV_CPU, client CPU $LG_CPU)"
# No -1 (one client, then exit): wait_port's probe would be that client.
taskset -c "$SRV_CPU" iperf3 -s -p 19801 > /dev/null 2>&1 &
IPERF=$!
STOP="kill $IPERF"
wait_port 127.0.0.1:19801
taskset -c "$LG_CPU" iperf3 -c 127.0.0.1 -p 19801 -t "$SECS" -J > "$WORK/iperf.json"
kill $IPERF; wait $IPERF 2>/dev/null || true
STOP=":"
python3 - "$WORK/iperf.json" >> "$JSON" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
bps = j["end"]["sum_received"]["bits_per_second"]
print(json.dumps({"label": "ceiling|iperf3 loopback", "op": "stream", "mb_per_sec": bps / 8e6}))
PY

log "disk ceiling: fio O_DIRECT in $WORK"
fio_row() { # name fio-args...
    local name="$1"
    shift
    taskset -c "$SRV_CPU" fio --name="$name" --filename="$WORK/fio.dat" --size=1G --direct=1 \
        --ioengine=io_uring --runtime="$SECS" --time_based --output-format=json "$@" \
        > "$WORK/fio-$name.json"
    python3 - "$WORK/fio-$name.json" "$name" >> "$JSON" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = j["read"] if j["read"]["io_bytes"] else j["write"]
lat = side.get("clat_ns", {}).get("percentile", {})
print(json.dumps({"label": f"ceiling|fio {sys.argv[2]}", "op": sys.argv[2],
    "ops_per_sec": side["iops"], "units_per_sec": side["iops"], "mb_per_sec": side["bw_bytes"] / 1e6,
    "latency_ms": {"p50": lat.get("50.000000", 0) / 1e6, "p99": lat.get("99.000000", 0) / 1e6}}))
PY
}
fio_row seq-write-1M-fsync --rw=write --bs=1M --iodepth=1 --fsync=1
fio_row seq-read-1M --rw=read --bs=1M --iodepth=16
fio_row rand-read-4K --rw=randread --bs=4K --iodepth=16

# ---- percore ----
log "percore (1 shard on CPU $SRV_CPU)"
AK=percore SK=percore-secret
PERCORE_LOG=warn "$BIN" serve --data "$WORK/percore" --shards 1 --cpus "$SRV_CPU" \
    --s3 127.0.0.1:19810 --native 127.0.0.1:19811 --admin 127.0.0.1:19812 > "$WORK/percore.log" 2>&1 &
P=$!
STOP="kill $P; wait $P"
wait_port 127.0.0.1:19810
PIDS=$P
workloads percore-s3 s3 127.0.0.1:19810 "put list mixed"
workloads percore-native native 127.0.0.1:19811 "put list mixed"
eval "$STOP" || true; STOP=":"
rm -rf "$WORK/percore"

# ---- nginx ----
if wants nginx; then
log "nginx (sendfile, 1 worker on CPU $SRV_CPU)"
python3 - "$WORK/www/bench" "${GET_SETS[@]}" <<'PY'
import os, sys
root = sys.argv[1]
mult = {"K": 1 << 10, "M": 1 << 20}
def write(path, size):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(os.urandom(size))
for s in sys.argv[2:]:
    size, n, prefix = s.split()
    b = int(size[:-1]) * mult[size[-1]]
    for i in range(int(n)):
        write(f"{root}/{prefix}{i:08d}", b)
write(f"{root}/r/large-{256 << 20}", 256 << 20)
PY
start_nginx "$SRV_CPU" "$WORK/www" 19820
peer_workloads nginx ""
rm -rf "$WORK/www"
fi

# ---- Garage ----
if wants garage; then
log "Garage (single node, fsync on, CPU $SRV_CPU)"
AK=$GARAGE_KEY_ID SK=$GARAGE_SECRET
start_garage "$SRV_CPU" "$WORK/garage" 19830
peer_workloads garage "put list mixed"
rm -rf "$WORK/garage"
fi

# ---- s3s-fs ----
if wants s3s-fs; then
log "s3s-fs (CPU $SRV_CPU)"
mkdir -p "$WORK/s3sfs/bench"
start_s3sfs "$SRV_CPU" "$WORK/s3sfs" 19840
peer_workloads s3s-fs "put list mixed"
rm -rf "$WORK/s3sfs"
fi

# ---- scaling ----
if [ "$SCALE" = 1 ]; then
    log "percore shard scaling (all shards on CPU $SRV_CPU: this machine has $(nproc) CPUs)"
    bash bench/scale.sh --shards "1 2 4" --server-cpus "$SRV_CPU" --client-cpus "$LG_CPU" \
        --secs "$SECS" --json "$JSON"
fi

PERCORE_REV="$REV" \
    python3 bench/report.py "$JSON" "$RES/$OUT" "bash bench/compare.sh $ARGS"
echo "wrote $RES/$OUT.md, $JSON and $RES/$OUT-*.svg"
