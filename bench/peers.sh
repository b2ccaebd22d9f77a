#!/usr/bin/env bash
# The peers percore is compared with, installed once and cached outside the
# repository (never in CI), and started on loopback pinned to one CPU.
#
#   bash bench/peers.sh install     # apt + cargo install into $PEERS (~10 min)
#   source bench/peers.sh           # start_nginx / start_garage / start_s3sfs
#
# PEERS (default /opt/percore-peers) holds bin/garage and bin/s3s-fs.
# Every start_* function sets PEER_PIDS (the processes whose CPU time is
# charged to the server) and PEER_ENDPOINT, and registers a stop in
# PEER_STOP (eval it).
PEERS="${PEERS:-/opt/percore-peers}"
GARAGE_VERSION="${GARAGE_VERSION:-}"     # empty: the newest that builds
S3SFS_VERSION="${S3SFS_VERSION:-0.14.1}" # 0.15+ needs rustc 1.96
# Fixed bench credentials for the peers (loopback only, throwaway data).
GARAGE_KEY_ID=GK0123456789abcdef01234567
GARAGE_SECRET=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef

peers_install() {
    set -e
    local apt=()
    command -v nginx >/dev/null || apt+=(nginx)
    command -v iperf3 >/dev/null || apt+=(iperf3)
    command -v fio >/dev/null || apt+=(fio)
    dpkg -s libsodium-dev >/dev/null 2>&1 || apt+=(libsodium-dev)
    dpkg -s libzstd-dev >/dev/null 2>&1 || apt+=(libzstd-dev)
    if [ ${#apt[@]} -gt 0 ]; then
        echo "installing ${apt[*]} (apt)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${apt[@]}"
    fi
    mkdir -p "$PEERS"
    # compare.sh --peers: build only the peers asked for.
    peer_wanted() { ! declare -f wants > /dev/null || wants "$1"; }
    if peer_wanted s3s-fs && [ ! -x "$PEERS/bin/s3s-fs" ]; then
        echo "building s3s-fs $S3SFS_VERSION into $PEERS (a few minutes)"
        cargo install s3s-fs --version "$S3SFS_VERSION" --locked --features binary --root "$PEERS"
    fi
    if peer_wanted garage && [ ! -x "$PEERS/bin/garage" ]; then
        echo "building Garage into $PEERS (about 8 minutes on 2 cores)"
        cargo install garage ${GARAGE_VERSION:+--version "$GARAGE_VERSION"} --locked \
            --no-default-features --features lmdb,system-libs --root "$PEERS"
    fi
    echo "peers: nginx $(nginx -v 2>&1 | cut -d/ -f2), $("$PEERS/bin/garage" --version 2>/dev/null | head -1), s3s-fs $S3SFS_VERSION, $(fio --version), $(iperf3 --version | head -1 | cut -d' ' -f1-2)"
}

wait_port() { # host:port [seconds]
    local hp="$1" n="${2:-20}"
    for _ in $(seq $((n * 10))); do
        (exec 3<>"/dev/tcp/${hp%:*}/${hp#*:}") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on $hp after ${n}s" >&2
    return 1
}

# nginx serving DIR as static files, sendfile on, one worker on CPU $1.
start_nginx() { # cpu dir port
    local cpu="$1" root="$2" port="$3" conf
    conf="$(mktemp /tmp/percore-bench-nginx.XXXX.conf)"
    cat > "$conf" <<EOF
user root;
worker_processes 1;
daemon off;
pid $conf.pid;
error_log $conf.err warn;
events { worker_connections 4096; }
http {
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    access_log off;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    default_type application/octet-stream;
    server { listen 127.0.0.1:$port; root $root; }
}
EOF
    taskset -c "$cpu" nginx -c "$conf" &
    local pid=$!
    wait_port "127.0.0.1:$port"
    PEER_PIDS="$(pgrep -d, -P $pid),$pid"
    PEER_ENDPOINT="127.0.0.1:$port"
    PEER_STOP="kill $pid; wait $pid 2>/dev/null; rm -f $conf $conf.pid $conf.err"
}

# Garage single node, lmdb metadata, data and metadata fsync on (durable
# acknowledgements, as percore's), region us-east-1, on CPU $1.
start_garage() { # cpu dir port
    local cpu="$1" dir="$2" port="$3" g="$PEERS/bin/garage"
    mkdir -p "$dir/meta" "$dir/data"
    cat > "$dir/garage.toml" <<EOF
metadata_dir = "$dir/meta"
data_dir = "$dir/data"
db_engine = "lmdb"
replication_factor = 1
metadata_fsync = true
data_fsync = true
rpc_bind_addr = "127.0.0.1:$((port + 1))"
rpc_public_addr = "127.0.0.1:$((port + 1))"
rpc_secret = "$GARAGE_SECRET"
[s3_api]
s3_region = "us-east-1"
api_bind_addr = "127.0.0.1:$port"
root_domain = ".s3.garage.localhost"
[admin]
api_bind_addr = "127.0.0.1:$((port + 3))"
EOF
    RUST_LOG=warn taskset -c "$cpu" "$g" -c "$dir/garage.toml" server > "$dir/garage.log" 2>&1 &
    local pid=$!
    wait_port "127.0.0.1:$port"
    wait_port "127.0.0.1:$((port + 1))"
    local gc=("$g" -c "$dir/garage.toml")
    local node
    for _ in $(seq 50); do
        node="$("${gc[@]}" status 2>/dev/null | awk '/^[0-9a-f]{16}/ {print $1; exit}')"
        [ -n "$node" ] && break
        sleep 0.2
    done
    "${gc[@]}" layout assign -z dc1 -c 10G "$node" > /dev/null
    "${gc[@]}" layout apply --version 1 > /dev/null
    "${gc[@]}" key import --yes -n bench "$GARAGE_KEY_ID" "$GARAGE_SECRET" > /dev/null 2>&1 ||
        "${gc[@]}" key import -n bench "$GARAGE_KEY_ID" "$GARAGE_SECRET" > /dev/null
    "${gc[@]}" bucket create bench > /dev/null
    "${gc[@]}" bucket allow --read --write --owner bench --key bench > /dev/null
    PEER_PIDS="$pid"
    PEER_ENDPOINT="127.0.0.1:$port"
    PEER_STOP="kill $pid; wait $pid 2>/dev/null"
}

# s3s-fs (the s3s crate's file-system example server) on CPU $1.
start_s3sfs() { # cpu dir port
    local cpu="$1" dir="$2" port="$3"
    mkdir -p "$dir"
    RUST_LOG=warn taskset -c "$cpu" "$PEERS/bin/s3s-fs" --host 127.0.0.1 --port "$port" \
        --access-key "$GARAGE_KEY_ID" --secret-key "$GARAGE_SECRET" "$dir" > "$dir.log" 2>&1 &
    local pid=$!
    wait_port "127.0.0.1:$port"
    PEER_PIDS="$pid"
    PEER_ENDPOINT="127.0.0.1:$port"
    PEER_STOP="kill $pid; wait $pid 2>/dev/null; rm -f $dir.log"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    case "${1:-}" in
        install) peers_install ;;
        *) echo "usage: bash bench/peers.sh install   (or source it)"; exit 2 ;;
    esac
fi
