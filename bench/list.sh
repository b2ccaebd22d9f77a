#!/usr/bin/env bash
# ListObjectsV2 over many keys with 1, 2 and 4 shards: load N empty objects
# through the S3 endpoint, then list them all in pages of 1000 (3 runs,
# median). Writes bench/results/list-<date>.md.
#
#   bash bench/list.sh [KEYS]          (default 1000000)
#   BENCH_SHARDS="1 2 4" BENCH_SERVER_CPUS=0 BENCH_CLIENT_CPUS=1 bash bench/list.sh 200000
#
# The server runs on BENCH_SERVER_CPUS and the load generator on
# BENCH_CLIENT_CPUS (taskset). With more shards than server CPUs the shards
# share CPUs (--unpinned): the figures then show the cost of merging pages
# across shards, not scaling. Scaling needs a machine with a core per shard.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
KEYS="${1:-1000000}"
SHARDS="${BENCH_SHARDS:-1 2 4}"
SERVER_CPUS="${BENCH_SERVER_CPUS:-0}"
CLIENT_CPUS="${BENCH_CLIENT_CPUS:-1}"
PORT="${BENCH_PORT:-19000}"
cargo build --release >/dev/null
mkdir -p bench/results
OUT="bench/results/list-$(date +%Y%m%d-%H%M%S).md"
WORK="$(mktemp -d /tmp/percore-listbench.XXXXXX)"
cleanup() { [ -n "${PID:-}" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
{
echo "# ListObjectsV2 over $KEYS keys ($(date -u +%F), $(nproc) CPUs, $(uname -r))"
echo
echo "Server on CPUs $SERVER_CPUS, load generator on CPUs $CLIENT_CPUS (taskset)."
echo "Keys: obj/XX/NNNNNNNN (XX = i mod 251), empty objects, loaded with 16 keep-alive connections."
echo "Listing: one connection, ListObjectsV2 max-keys=1000 following continuation tokens; median of 3 runs."
echo
echo "| shards | load PUT/s | seconds to list all | pages/s |"
echo "|---|---|---|---|"
} > "$OUT"
for n in $SHARDS; do
  rm -rf "$WORK/data"
  taskset -c "$SERVER_CPUS" ./target/release/percore serve --data "$WORK/data" --shards "$n" --unpinned \
      --s3 "127.0.0.1:$PORT" --native "127.0.0.1:$((PORT + 1))" --admin "127.0.0.1:$((PORT + 2))" \
      > "$WORK/server.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do grep -q "percore: ready" "$WORK/server.log" && break; sleep 0.1; done
  grep -q "percore: ready" "$WORK/server.log" || { cat "$WORK/server.log"; exit 1; }
  echo "== $n shard(s)" >&2
  res=$(taskset -c "$CLIENT_CPUS" ./target/release/percore-bench s3-list --endpoint "127.0.0.1:$PORT" --keys "$KEYS")
  echo "$res" >&2
  put=$(echo "$res" | sed -n 's/.*(\([0-9]*\) PUT\/s.*/\1/p')
  secs=$(echo "$res" | sed -n 's/.*median of [0-9]*: \([0-9.]*\) s to list all.*/\1/p')
  pps=$(echo "$res" | sed -n 's/.*, \([0-9]*\) pages\/s.*/\1/p')
  echo "| $n | $put | $secs | $pps |" >> "$OUT"
  kill "$PID"; wait "$PID" || true; PID=""
done
echo >> "$OUT"
echo "Command: \`bash bench/list.sh $KEYS\`" >> "$OUT"
cat "$OUT"
