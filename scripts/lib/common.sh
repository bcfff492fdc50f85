# Shared by the benchmark scripts: a temp dir and the children to stop (both cleaned up on
# exit), a wait for a TCP port to accept connections (up to 30 s), and the CPU ticks of a
# process tree.
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
wait_port() { for _ in $(seq 1 600); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }
# utime and stime ticks (of all threads) of a process tree, the root pid and its children:
# "USER SYS".
cpu_ticks_split() {
  local user=0 sys=0 p u s
  for p in $(pgrep -P "$1") "$1"; do
    [ -r /proc/$p/stat ] || continue
    read -r u s < <(awk '{print $14, $15}' /proc/$p/stat)
    user=$(( user + u )); sys=$(( sys + s ))
  done
  echo "$user $sys"
}
# Sum of utime+stime ticks of a process tree.
cpu_ticks() { local u s; read -r u s < <(cpu_ticks_split "$1"); echo $(( u + s )); }
