# shellcheck shell=bash
# Sourced by bench.sh and ab.sh: the host's CPU in use between two marks
# of /proc/stat (%, all cores, idle and iowait excluded). Where goodput.py
# alone keeps a host of few cores busy in the kernel's per-packet path,
# G is as much the CPU's bound as the rails'.
cpu_mark() { awk '/^cpu / { print $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9, $5 + $6 }' /proc/stat; }
cpu_busy() { # MARK0 MARK1 -> percent
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); t = y[1] - x[1];
    printf "%.0f\n", (t > 0 ? 100 * (t - (y[2] - x[2])) / t : 0) }'
}
