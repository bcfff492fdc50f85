# Shared by the fixed-rate filter scripts (filter-cpu-per-request.sh, filter-cpu-side-by-side.sh):
# a process's CPU time from the scheduler, that time per request of a fixed-rate window, and
# the check that a load run saw no errors.

# Nanoseconds the scheduler ran the process's threads (%.0f: mawk's %d stops at 2^31).
run_ns() { cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {printf "%.0f\n", s}'; }

# Microseconds per request: run_ns before and after, the rate and the window in seconds.
us_per_request() { awk -v d=$(($2 - $1)) -v r="$3" -v w="$4" 'BEGIN { printf "%.3f", d / 1e3 / (r * w) }'; }

# Exit with the load's report if it saw socket errors or 4xx/5xx answers.
fail_on_load_errors() { # report-file what
  if grep -qE "Socket errors: .*[1-9]|[45]xx [1-9]" "$1"; then
    echo "the load of $2 saw errors:" >&2; cat "$1" >&2; exit 1
  fi
}
