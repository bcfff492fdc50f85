#!/usr/bin/env bash
# Stage what scripts/bench-16core-run.sh needs on a bare machine (the lent many-core machine
# has Python and nothing else) in one folder:
#   DIR/keymaster                 this build (target/release/keymaster, or KM=...)
#   DIR/keymaster-b               with KM_B=...: a second build, for bench-ab-run.sh
#   DIR/bench-16core-run.sh       the run, and bench-scale-report.py that makes its tables;
#                                 bench-ab-run.sh, an A/B of two builds
#   DIR/bin/nginx, DIR/bin/haproxy, DIR/bin/wrk (if installed)
#                                 wrappers that start the copied binaries through the copied
#                                 dynamic loader, with DIR/lib as the only library path
#   DIR/lib/                      the peers' shared libraries and loader, copied from here
# Then, on the machine: OUT=... DIR/bench-16core-run.sh. Check it here first, with the system
# peers out of the way of the copies (PATH puts DIR/bin first):
#   scripts/stage-many-core-run.sh /tmp/stage
#   SCALE=1 CONNS=700 DUR=2s RAMPDUR=2s WARM=1s OUT=/tmp/stage-out /tmp/stage/bench-16core-run.sh
# usage: scripts/stage-many-core-run.sh DIR
set -euo pipefail
DIR=${1:?usage: scripts/stage-many-core-run.sh DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
KM=${KM:-$HERE/../target/release/keymaster}
[ -x "$KM" ] || { echo "no $KM: cargo build --release first" >&2; exit 1; }
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib/exec"
cp "$KM" "$DIR/keymaster"
if [ -n "${KM_B:-}" ]; then
  cp "$KM_B" "$DIR/keymaster-b"
  # Two builds and the peers come near the 64 MiB a device run may carry: no symbols.
  strip "$DIR/keymaster" "$DIR/keymaster-b" 2>/dev/null || true
fi
cp "$HERE/bench-16core-run.sh" "$HERE/bench-scale-report.py" "$HERE/bench-ab-run.sh" "$DIR/"

# The program's shared libraries (ldd's resolved paths) and its loader, into DIR/lib.
copy_libs() {
  ldd "$1" | awk '/=> \// {print $3} /^\t\/.*ld-linux/ {print $1}' | while read -r lib; do
    cp -L "$lib" "$DIR/lib/"
  done
}

stage() { # name
  local path
  path=$(command -v "$1" || true)
  [ -n "$path" ] || path=/usr/sbin/$1
  if [ ! -x "$path" ]; then
    echo "$1: not installed here, not staged"
    return
  fi
  cp -L "$path" "$DIR/lib/exec/$1"
  copy_libs "$path"
  cat > "$DIR/bin/$1" <<'WRAP'
#!/bin/sh
# A staged peer: the copied binary, through the copied loader and libraries.
here=$(cd "$(dirname "$0")/.." && pwd)
exec "$here/lib/LOADER" --library-path "$here/lib" "$here/lib/exec/NAME" "$@"
WRAP
  local loader
  loader=$(ldd "$path" | awk '/^\t\/.*ld-linux/ {print $1}' | xargs basename)
  sed -i "s/LOADER/$loader/; s/NAME/$1/" "$DIR/bin/$1"
  chmod +x "$DIR/bin/$1"
  echo "$1: $path staged ($(env -i "$DIR/bin/$1" -v 2>&1 | head -1))"
}

stage nginx
stage haproxy
stage wrk
du -sh "$DIR"
