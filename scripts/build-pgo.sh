#!/usr/bin/env bash
# A profile-guided build of keymaster: build it instrumented, run it as a proxy under a mix
# of traffic (scripts/lib/pgo-train.sh: HTTP/1.1 keep-alive at several body sizes, a new
# connection per request, many idle connections at a fixed rate, HTTP/2, TLS), merge the
# profile, and build again with it. The result is target/pgo/release/keymaster; the
# instrumented build is in target/pgo-gen, the profile in target/pgo-data.
#
# Why (decision record 0022): the request path's code is spread over more than the CPU's
# first-level instruction cache holds; the profile lets the compiler lay out and inline
# the hot path together. About 15-20% fewer user-space instructions per request.
#
# usage: scripts/build-pgo.sh      (two release builds: about 10 minutes on 2 cores)
# needs: the llvm-tools rustup component (`rustup component add llvm-tools`), openssl for
# the TLS part of the training (skipped without it)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DATA=$ROOT/target/pgo-data
HOST=$(rustc -vV | sed -n 's/^host: //p')
PROFDATA=$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata
if [ ! -x "$PROFDATA" ]; then
  echo "no llvm-profdata in the toolchain: rustup component add llvm-tools" >&2
  exit 1
fi
rm -rf "$DATA"
mkdir -p "$DATA/raw"

echo "== instrumented build (target/pgo-gen)"
RUSTFLAGS="-Cprofile-generate=$DATA/raw" CARGO_TARGET_DIR=$ROOT/target/pgo-gen \
  cargo build --release --locked --bin keymaster

echo "== training"
PGO_DATA=$DATA "$ROOT/scripts/lib/pgo-train.sh" "$ROOT/target/pgo-gen/release/keymaster"
"$PROFDATA" merge -o "$DATA/keymaster.profdata" "$DATA"/raw/*.profraw

echo "== optimized build (target/pgo)"
RUSTFLAGS="-Cprofile-use=$DATA/keymaster.profdata" CARGO_TARGET_DIR=$ROOT/target/pgo \
  cargo build --release --locked --bin keymaster
ls -la "$ROOT/target/pgo/release/keymaster"
