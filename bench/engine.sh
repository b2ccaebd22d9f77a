#!/usr/bin/env bash
# Engine throughput next to fio on the same disk, and recovery of many objects.
# Server work (the engine) runs pinned to CPU $BENCH_CPU (default 1).
#
#   bash bench/engine.sh [DIR]      (DIR on the disk to measure; default ./bench-data)
#   BENCH_BYTES=1073741824 BENCH_RECOVERY_OBJECTS=1000000 bash bench/engine.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR="${1:-./bench-data}"
CPU="${BENCH_CPU:-1}"
BYTES="${BENCH_BYTES:-1073741824}"
OBJECTS="${BENCH_RECOVERY_OBJECTS:-1000000}"
mkdir -p "$DIR" bench/results
command -v fio >/dev/null || { echo "installing fio"; apt-get install -y -qq fio >/dev/null; }
cargo build --release -p percore-bench >/dev/null
OUT="bench/results/engine-$(date +%Y%m%d-%H%M%S).md"
{
echo "# Engine vs fio ($(date -u +%F), $(nproc) CPUs, $(uname -r))"
echo
echo "Disk: $(df -h "$DIR" | tail -1 | awk '{print $1}'), filesystem $(stat -f -c %T "$DIR"). Engine pinned to CPU $CPU; one shard; 64 concurrent operations; O_DIRECT."
echo
echo "## fio (O_DIRECT, io_uring, iodepth 64, ${BYTES} bytes per size)"
echo
echo "| block | write MB/s (no sync) | write MB/s (fdatasync every 64 writes) | randread MB/s | randread IOPS |"
echo "|---|---|---|---|---|"
for bs in 4096 65536 1048576; do
  f="$DIR/fio.dat"
  w=$(fio --name=w --filename="$f" --rw=write --bs=$bs --size=$BYTES --direct=1 --ioengine=io_uring --iodepth=64 --cpus_allowed=$CPU --output-format=json 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["write"]; print(round(j["bw_bytes"]/1e6))')
  ws=$(fio --name=ws --filename="$f" --rw=write --bs=$bs --size=$BYTES --direct=1 --ioengine=io_uring --iodepth=64 --fdatasync=64 --cpus_allowed=$CPU --output-format=json 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["write"]; print(round(j["bw_bytes"]/1e6))')
  r=$(fio --name=r --filename="$f" --rw=randread --bs=$bs --size=$BYTES --direct=1 --ioengine=io_uring --iodepth=64 --runtime=10 --time_based --cpus_allowed=$CPU --output-format=json 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["read"]; print(round(j["bw_bytes"]/1e6), round(j["iops"]))')
  echo "| $bs | $w | $ws | ${r% *} | ${r#* } |"
  rm -f "$f"
done
echo
echo "## percore engine (PUT = durable: write + fdatasync, group commit; GET = O_DIRECT read + CRC check)"
echo
./target/release/percore-bench engine --dir "$DIR" --bytes "$BYTES" --concurrency 64 --cpu "$CPU"
echo
echo "## Recovery"
echo
./target/release/percore-bench recovery --dir "$DIR" --objects "$OBJECTS" --cpu "$CPU"
} | tee "$OUT"
echo "wrote $OUT"
