#!/usr/bin/env bash
# train_mlp's progress under ddprun: on a terminal (a pseudo-terminal here) rank 0 draws its bar, which ddprun
# passes on whole at each carriage return, each bar "[rank 0] [###...] epoch=... step=S/T ..." ending in "\r";
# into a pipe, and with DDP_PROGRESS_BAR=0, plain lines and no carriage return at all.
set -uo pipefail
ddprun="$1"
train="$2"
source "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/test_harness.sh"
run=("$ddprun" -np 2 -- "$train" --device cpu --hidden 32 --layers 1 --max-steps 40 --log-every 10)

# Runs the job on a pseudo-terminal and prints what the terminal received, byte for byte (repr per line).
on_terminal() {
  /usr/bin/python3 - "$@" <<'PY'
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
data = b""
while True:
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    data += chunk
_, status = os.waitpid(pid, 0)
sys.stdout.write(data.decode(errors="replace").replace("\r\n", "\n"))  # the terminal's own newline translation
sys.exit(os.waitstatus_to_exitcode(status))
PY
}

out=$(on_terminal "${run[@]}") || fail "the job on a terminal failed: $out"
bars=$(grep -o $'\[rank 0\] \[[#.]\{30\}\] epoch=0 step=[0-9]*/40 loss=[0-9.]* [^\r]*\e\[K\r' <<<"$out" | wc -l)
[ "$bars" -ge 4 ] || { fail "expected a bar for each of steps 10, 20, 30, 40 on the terminal, found $bars:"; cat -v <<<"$out"; }
grep -q $'\[rank 0\] \[##############################\] epoch=0 step=40/40' <<<"$out" || fail "no full bar at step 40"
grep -q $'\[rank 0\] final step=40 ' <<<"$out" || { fail "no final line after the bars:"; cat -v <<<"$out"; }
grep -q $'^\[rank 0\] epoch=0 step=10/40' <<<"$out" && fail "a plain step line on the terminal"

out=$(on_terminal env DDP_PROGRESS_BAR=0 "${run[@]}") || fail "the job with DDP_PROGRESS_BAR=0 failed"
grep -q $'\r' <<<"$out" && fail "DDP_PROGRESS_BAR=0: a carriage return on the terminal"
grep -q '^\[rank 0\] epoch=0 step=10/40 loss=' <<<"$out" || fail "DDP_PROGRESS_BAR=0: no plain step line"

out=$("${run[@]}" 2>&1) || fail "the job into a pipe failed"
grep -q $'\r' <<<"$out" && fail "into a pipe: a carriage return"
[ "$(grep -c '^\[rank 0\] epoch=0 step=[0-9]*/40 loss=' <<<"$out")" = 4 ] || { fail "into a pipe: not 4 step lines:"; echo "$out"; }

finish progress_bar
