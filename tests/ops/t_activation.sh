#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Socket activation with the real systemd-socket-activate (client and admin
# sockets passed by name) and the notify protocol against a stand-in notify
# socket: READY with STATUS, WATCHDOG every WATCHDOG_USEC/2, a stalled loop
# stops the pings, SIGHUP gives RELOADING then READY, SIGTERM gives STOPPING,
# and the inherited sockets are neither shut down nor unlinked.
source "$(dirname "$0")/lib.sh"

command -v systemd-socket-activate >/dev/null || skip "systemd-socket-activate is not installed"
command -v python3 >/dev/null || skip "python3 is not installed"

python3 "$OPS_DIR/notify_listener.py" "$T/notify.sock" "$T/notify.txt" &
track $!
wait_for 50 grep -q LISTENING "$T/notify.txt" || fail "notify listener did not start"

# Messages since a mark: lines of notify.txt after line number $1.
since() { tail -n +"$(($1 + 1))" "$T/notify.txt"; }
mark() { wc -l <"$T/notify.txt"; }

systemd-socket-activate --seqpacket -l "$T/act.sock" -l "$T/act-admin.sock" --fdname=client:admin \
	-E NOTIFY_SOCKET="$T/notify.sock" -E WATCHDOG_USEC=1000000 \
	-E RDMAXD_TEST_HOOKS=1 -E RDMAXD_TEST_STALL_MS=2500 \
	"$RDMAXD" --node-name act --socket "$T/act.sock" --port 0 --transport tcp \
	--log-level info 2>"$T/act.log" &
pid=$!
track "$pid"
wait_for 50 grep -q "Listening on $T/act-admin.sock" "$T/act.log" || fail "systemd-socket-activate did not listen"
# Like systemd, the tool starts the daemon on the first connection: this request
# waits in the socket until the daemon is up and answers it.
"$RDMAXCTL" --socket "$T/act-admin.sock" --json status >"$T/status.json" || fail "rdmaxctl status"
wait_for 100 grep -q 'READY=1' "$T/notify.txt" || fail "no READY=1"
[ "$(cat /proc/$pid/comm)" = rdmaxd ] || fail "pid $pid is not rdmaxd"
ready=$(grep 'READY=1' "$T/notify.txt" | head -n 1)
echo "$ready" | grep -q 'STATUS=tcp 127.0.0.1:[0-9]*; 0 clients' || fail "READY without a STATUS summary: $ready"
log "READY=1 with $(echo "$ready" | grep -o 'STATUS=[^|]*')"
grep -q "using the client socket '$T/act.sock' passed by the service manager" "$T/act.log" ||
	fail "client socket not taken from the service manager"
grep -q "using the admin socket '$T/act-admin.sock' passed by the service manager" "$T/act.log" ||
	fail "admin socket not taken from the service manager"

json_check "$T/status.json" 'j["socket_activated"] is True and j["socket"] == "'"$T/act.sock"'"' ||
	fail "status does not report socket activation"
python3 - "$T/act.sock" <<'PY' || fail "client socket does not accept"
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
PY
log "inherited client and admin sockets serve requests"

# Watchdog: WATCHDOG_USEC=1000000 means a ping about every 0.5 s. Wait for seven pings (six
# intervals) rather than counting what a fixed time brought: a loaded machine only slows it.
m=$(mark)
wait_for 150 sh -c "[ \$(tail -n +$((m + 1)) '$T/notify.txt' | grep -c 'WATCHDOG=1') -ge 7 ]" ||
	fail "fewer than 7 watchdog pings in 15 s"
since "$m" | grep 'WATCHDOG=1' | head -n 7 | awk '{print $1}' >"$T/pings.txt"
# The median interval, so one ping delayed by a loaded machine does not fail the test.
median=$(awk 'NR > 1 { print $1 - prev } { prev = $1 }' "$T/pings.txt" | sort -n |
	awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
awk -v m="$median" 'BEGIN { exit !(m >= 0.4 && m <= 0.65) }' ||
	fail "median watchdog interval $median s, expected 0.5 s"
log "watchdog: 7 pings, median interval $median s"

# A stalled loop must stop the pings: that is what lets systemd restart a hung daemon.
# RDMAXD_TEST_STALL_MS=2500: wait until a ping comes more than 2 s after the signal.
stalled_at=$(python3 -c 'import time; print(time.monotonic())')
kill -USR2 "$pid"
wait_for 150 awk -v t="$stalled_at" '/WATCHDOG=1/ && $1 > t + 2.0 { f = 1 } END { exit !f }' \
	"$T/notify.txt" || fail "pings did not resume within 15 s of a 2.5 s stall"
# Over the whole run: the last ping before the signal starts the gap.
grep 'WATCHDOG=1' "$T/notify.txt" | awk '{print $1}' >"$T/pings2.txt"
gap=$(awk 'NR > 1 { d = $1 - prev; if (d > max) max = d } { prev = $1 } END { print max + 0 }' "$T/pings2.txt")
awk -v g="$gap" 'BEGIN { exit !(g >= 2.0) }' || fail "longest gap between pings was $gap s during a 2.5 s stall"
log "stalled loop: no ping for ${gap} s, then pings resumed"

# SIGHUP: RELOADING=1, then READY=1 again.
m=$(mark)
kill -HUP "$pid"
wait_for 50 sh -c "tail -n +$((m + 1)) '$T/notify.txt' | grep -q 'READY=1'" || fail "no READY=1 after SIGHUP"
since "$m" | grep -v WATCHDOG | head -n 3 >"$T/reload.txt"
head -n 1 "$T/reload.txt" | grep -q 'RELOADING=1' || fail "reload did not start with RELOADING=1: $(cat "$T/reload.txt")"
grep -q 'MONOTONIC_USEC=' "$T/reload.txt" || fail "RELOADING=1 without MONOTONIC_USEC"
log "SIGHUP: RELOADING=1 then READY=1"

# STATUS= is refreshed on its own every 5 s (the run is past 8 s by now).
grep -Eq '^[0-9.]+ STATUS=tcp ' "$T/notify.txt" || fail "no periodic STATUS= refresh"
log "STATUS= refreshed on a timer"

# SIGTERM: STOPPING=1, clean exit, sockets left for the socket unit.
m=$(mark)
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || fail "rdmaxd exited with $rc"
since "$m" | grep -q 'STOPPING=1' || fail "no STOPPING=1"
[ -S "$T/act.sock" ] || fail "the inherited client socket was unlinked"
[ -S "$T/act-admin.sock" ] || fail "the inherited admin socket was unlinked"
log "SIGTERM: STOPPING=1, exit 0, inherited sockets still in place"

# Without RDMAXD_TEST_HOOKS the stall hook does not exist: SIGUSR2 keeps its default action.
"$RDMAXD" --node-name plain --socket "$T/plain.sock" --port 0 --transport tcp 2>"$T/plain.log" &
plain=$!
track "$plain"
wait_for 100 test -S "$T/plain-admin.sock" || fail "plain daemon did not start"
kill -USR2 "$plain"
rc=0
{ wait "$plain"; } 2>/dev/null || rc=$?
[ "$rc" -eq $((128 + 12)) ] || fail "SIGUSR2 without the opt-in gave status $rc, expected death by SIGUSR2"
log "without RDMAXD_TEST_HOOKS=1, SIGUSR2 is not handled (the hook is opt-in)"
