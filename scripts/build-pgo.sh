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
# With BOLT=1 the binary is then laid out again by llvm-bolt from a profile of the same
# training (taken by BOLT's own instrumentation) and written to target/pgo/keymaster-bolt,
# after the training mix has run through it once more as a check; the profile-guided
# binary is then linked with --emit-relocs (a larger file, the same code). Decision record
# 0035: 4-14% fewer instruction-cache misses, CPU within this VM's noise: not the default.
#
# usage: [BOLT=1 | BOLT=llvm-bolt-command] scripts/build-pgo.sh
#        (two release builds: about 10 minutes on 2 cores; BOLT adds about a minute)
# needs: the llvm-tools rustup component (`rustup component add llvm-tools`), openssl for
# the TLS part of the training (skipped without it); for BOLT, llvm-bolt (Debian:
# `apt-get install bolt-16`)
set -euo pipefail
ASKED=${BOLT:-}
case $ASKED in
  '' | 0 | no | none) ASKED= BOLT= ;;
  1) BOLT=$(command -v llvm-bolt || find /usr/lib -maxdepth 3 -path '*/llvm-*/bin/llvm-bolt' 2>/dev/null | sort -V | tail -1 || true) ;;
  *) BOLT=$(command -v "$BOLT" || true) ;; # a command name or a path, before the cd below
esac
# Through any symlink (/usr/bin/llvm-bolt-16): llvm-bolt finds its runtime library beside itself.
[ -z "$BOLT" ] || BOLT=$(readlink -f "$BOLT")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DATA=$ROOT/target/pgo-data
HOST=$(rustc -vV | sed -n 's/^host: //p')
PROFDATA=$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata
if [ ! -x "$PROFDATA" ]; then
  echo "no llvm-profdata in the toolchain: rustup component add llvm-tools" >&2
  exit 1
fi
RELOCS=
if [ -n "$ASKED" ]; then
  if [ -z "$BOLT" ] || [ ! -x "$BOLT" ]; then
    echo "BOLT=$ASKED: no llvm-bolt there (apt-get install bolt-16)" >&2
    exit 1
  fi
  # The relocations BOLT needs to move functions (not loaded at run time).
  RELOCS="-Clink-arg=-Wl,--emit-relocs"
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
RUSTFLAGS="-Cprofile-use=$DATA/keymaster.profdata $RELOCS" CARGO_TARGET_DIR=$ROOT/target/pgo \
  cargo build --release --locked --bin keymaster
PGO=$ROOT/target/pgo/release/keymaster
ls -la "$PGO"
[ -n "$RELOCS" ] || exit 0

OUT=$ROOT/target/pgo/keymaster-bolt
echo "== BOLT: instrumented ($BOLT)"
mkdir -p "$DATA/bolt"
"$BOLT" "$PGO" -o "$DATA/bolt/keymaster-instrumented" -instrument \
  -instrumentation-file="$DATA/bolt/keymaster.fdata" \
  >"$DATA/bolt/instrument.log" 2>&1 || { cat "$DATA/bolt/instrument.log" >&2; exit 1; }
echo "== BOLT: training (the stub and the generator run as the profile-guided build)"
PGO_DATA= "$ROOT/scripts/lib/pgo-train.sh" "$DATA/bolt/keymaster-instrumented" "$PGO"
if [ ! -s "$DATA/bolt/keymaster.fdata" ]; then
  echo "the BOLT-instrumented proxy wrote no profile ($DATA/bolt/keymaster.fdata)" >&2
  exit 1
fi
echo "== BOLT: layout"
# Blocks ordered for the instruction cache, functions clustered by their calls, the cold
# blocks of hot functions split off, identical functions folded.
"$BOLT" "$PGO" -o "$OUT.tmp" -data="$DATA/bolt/keymaster.fdata" \
  -reorder-blocks=ext-tsp -reorder-functions=hfsort+ -split-functions -split-all-cold \
  -split-eh -icf -use-gnu-stack \
  >"$DATA/bolt/optimize.log" 2>&1 || { cat "$DATA/bolt/optimize.log" >&2; exit 1; }
chmod 755 "$OUT.tmp"
echo "== BOLT: the training mix through the result, as a check"
PGO_DATA= "$ROOT/scripts/lib/pgo-train.sh" "$OUT.tmp" "$PGO"
mv "$OUT.tmp" "$OUT"
ls -la "$OUT"
