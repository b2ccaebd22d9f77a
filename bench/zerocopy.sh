#!/usr/bin/env bash
# GET throughput and server CPU per GB: percore's copy path vs its data ring
# (READ_FIXED into registered buffers + SEND_ZC) vs nginx with sendfile on
# the same objects, then SQPOLL on, then a submit-batch sweep. One shard.
# Writes bench/results/zerocopy-<date>.md.
#
#   bash bench/zerocopy.sh
#   BENCH_SECONDS=8 BENCH_SERVER_CPUS=0 BENCH_CLIENT_CPUS=1 bash bench/zerocopy.sh
#
# Honesty notes printed with the results: on loopback (and veth) the kernel
# always copies SEND_ZC payloads, so the counters say "copied", never
# zero-copy; nginx serves from the page cache while percore reads every
# object from the device with O_DIRECT.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECS="${BENCH_SECONDS:-8}"
SERVER_CPUS="${BENCH_SERVER_CPUS:-0}"
CLIENT_CPUS="${BENCH_CLIENT_CPUS:-1}"
CONC="${BENCH_CONCURRENCY:-16}"
PORT="${BENCH_PORT:-19100}"
command -v nginx >/dev/null || { echo "installing nginx"; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; }
cargo build --release >/dev/null
mkdir -p bench/results
OUT="bench/results/zerocopy-$(date +%Y%m%d-%H%M%S).md"
WORK="$(mktemp -d /tmp/percore-zcbench.XXXXXX)"
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null || true
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
BENCH=./target/release/percore-bench
SIZES="1048576:128 65536:1024"   # size:objects

start_percore() { # label, extra env...
  rm -rf "$WORK/data"
  env "$@" taskset -c "$SERVER_CPUS" ./target/release/percore serve --data "$WORK/data" --shards 1 --cpus "${SERVER_CPUS%%,*}" \
      --s3 "127.0.0.1:$PORT" --native "127.0.0.1:$((PORT + 1))" --admin "127.0.0.1:$((PORT + 2))" \
      ${PERCORE_EXTRA:-} > "$WORK/server.log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do grep -q "percore: ready" "$WORK/server.log" && break; sleep 0.1; done
  grep -q "percore: ready" "$WORK/server.log" || { cat "$WORK/server.log"; exit 1; }
}
stop_percore() { kill "$PID"; wait "$PID" || true; PID=""; }
sends() { # zero-copy / copied / plain ring sends so far
  curl -s "127.0.0.1:$((PORT + 2))/metrics" | awk '
    /^percore_ring_sends_zero_copy_total/ {z+=$2} /^percore_ring_sends_copied_total/ {c+=$2}
    /^percore_ring_sends_plain_total/ {p+=$2} END {printf "%d / %d / %d", z, c, p}'
}
run_percore() { # label, then env assignments
  local label="$1"; shift
  start_percore "$@"
  for sz in $SIZES; do
    size="${sz%%:*}"; n="${sz##*:}"
    taskset -c "$CLIENT_CPUS" $BENCH s3-get --endpoint "127.0.0.1:$PORT" --size "$size" --objects "$n" --prefix "o$size-" \
      --load --seconds 1 --concurrency "$CONC" --server-pids "$PID" --label warmup > /dev/null
    row=$(taskset -c "$CLIENT_CPUS" $BENCH s3-get --endpoint "127.0.0.1:$PORT" --size "$size" --objects "$n" --prefix "o$size-" \
      --seconds "$SECS" --concurrency "$CONC" --server-pids "$PID" --label "$label")
    echo "$row $(sends) |" | tee -a "$OUT"
  done
  stop_percore
}

{
echo "# GET: copy path vs data ring vs nginx sendfile ($(date -u +%F), $(nproc) CPUs, $(uname -r))"
echo
echo "One percore shard pinned to CPU $SERVER_CPUS; nginx (1 worker) on the same CPU; the load generator on CPU $CLIENT_CPUS,"
echo "$CONC keep-alive connections, random whole-object GETs for ${SECS} s after a 1 s warm-up, signed (SigV4) requests."
echo "Server CPU-s/GB: user+system CPU of the server processes (from /proc) per GB of bodies sent."
echo
echo "Loopback: the kernel copies every SEND_ZC payload; the counters show it (zero-copy / copied / plain sends). No zero-copy"
echo "is claimed from this run. nginx serves from the page cache; percore reads each object from the device (O_DIRECT)."
echo "Objects of 256 KiB and less are read whole with their record header in one I/O and sent by the copy path in both"
echo "percore modes; larger ones (the 1 MiB rows) go through the data ring unless it is off."
echo
echo "| server | object bytes | req/s | MB/s | p50 ms | p99 ms | server CPU-s/GB | ring sends zero-copy / copied / plain |"
echo "|---|---|---|---|---|---|---|---|"
} > "$OUT"

run_percore "percore copy path" PERCORE_DATA_RING=0
run_percore "percore data ring" PERCORE_DATA_RING=1
run_percore "percore data ring + SQPOLL" PERCORE_DATA_RING=1 PERCORE_RING_SQPOLL_MS=1000

# nginx with sendfile, same objects as files.
mkdir -p "$WORK/www/get-bench"
for sz in $SIZES; do
  size="${sz%%:*}"; n="${sz##*:}"
  python3 - "$WORK/www/get-bench" "$size" "$n" <<'PY'
import sys
d, size, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
body = bytes((i * 31 % 251) for i in range(size))
for i in range(n):
    open(f"{d}/o{size}-{i:06d}", "wb").write(body)
PY
done
cat > "$WORK/nginx.conf" <<EOF
user root;
worker_processes 1;
daemon off;
master_process on;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_timeout 65;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$((PORT + 5)); root $WORK/www; location / { } }
}
EOF
taskset -c "$SERVER_CPUS" nginx -c "$WORK/nginx.conf" > "$WORK/nginx.out" 2>&1 &
for _ in $(seq 50); do [ -f "$WORK/nginx.pid" ] && break; sleep 0.1; done
sleep 0.5
NGINX_PIDS="$(cat "$WORK/nginx.pid"),$(pgrep -P "$(cat "$WORK/nginx.pid")" | paste -sd,)"
for sz in $SIZES; do
  size="${sz%%:*}"; n="${sz##*:}"
  taskset -c "$CLIENT_CPUS" $BENCH s3-get --endpoint "127.0.0.1:$((PORT + 5))" --size "$size" --objects "$n" --prefix "o$size-" \
    --seconds 1 --concurrency "$CONC" --server-pids "$NGINX_PIDS" --label warmup > /dev/null
  row=$(taskset -c "$CLIENT_CPUS" $BENCH s3-get --endpoint "127.0.0.1:$((PORT + 5))" --size "$size" --objects "$n" --prefix "o$size-" \
    --seconds "$SECS" --concurrency "$CONC" --server-pids "$NGINX_PIDS" --label "nginx sendfile")
  echo "$row n/a |" | tee -a "$OUT"
done
kill "$(cat "$WORK/nginx.pid")"; wait 2>/dev/null || true; rm -f "$WORK/nginx.pid"

{
echo
echo "## Submit batch sweep (data ring, 1 MiB GETs): SQEs submitted together at most"
echo
echo "| server | object bytes | req/s | MB/s | p50 ms | p99 ms | server CPU-s/GB | ring sends zero-copy / copied / plain |"
echo "|---|---|---|---|---|---|---|---|"
} >> "$OUT"
SIZES_SAVE="$SIZES"; SIZES="1048576:128"
for batch in 1 4 16 64 256; do
  run_percore "data ring, batch $batch" PERCORE_DATA_RING=1 PERCORE_RING_BATCH="$batch"
done
SIZES="$SIZES_SAVE"
echo >> "$OUT"
echo "Command: \`bash bench/zerocopy.sh\`" >> "$OUT"
cat "$OUT"
