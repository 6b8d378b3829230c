# Sourced (not run) by tests that end groups of processes they did not start directly (a "host" of sshd and its
# ranks, a Slurm daemon and its job steps).
# process_tree PID...: the given processes and every process under them, from one look at /proc.
process_tree() {
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v roots="$*" '
    { pid = $1; sub(/.*\) /, ""); split($0, field, " "); parent[pid] = field[2] }
    END {
      n = split(roots, queue, " ")
      for (i = 1; i <= n; i++) seen[queue[i]] = 1
      for (i = 1; i <= n; i++) for (p in parent) if (parent[p] == queue[i] && !(p in seen)) { seen[p] = 1; queue[++n] = p }
      for (p in seen) print p
    }'
}
