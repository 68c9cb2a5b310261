#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rdmaxctl against running daemons with real clients and traffic: every
# subcommand in text and JSON (JSON parsed and checked), jobs in flight seen
# while a peer is stopped, drain and resume, peer reset, exit codes, and the
# admin socket refusing users who are neither root nor in rdmaxd-admin.
source "$(dirname "$0")/lib.sh"

command -v python3 >/dev/null || skip "python3 is not installed"
[ -x "$BUILD/rdmax-demo" ] || skip "$BUILD/rdmax-demo is not built"

# Long peer deadlines: jobs towards the stopped peer must stay in flight, however slow this machine.
start_daemon prefill --set peers.connect_timeout_ms=60000 --set peers.peer_timeout_ms=60000
start_daemon decode
decode_port=$(ctl decode --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["transports"][0]["endpoints"][0]["port"])')

# A receiving client that stays connected with a registered region.
"$BUILD/rdmax-demo" receive --socket "$T/decode.sock" --desc "$T/kv.desc" >"$T/receive.log" 2>&1 &
receiver=$!
track "$receiver"
wait_for 100 test -s "$T/kv.desc" || fail "receiver did not publish its descriptor"

ctl decode --json clients >"$T/clients.json" || fail "rdmaxctl clients"
json_check "$T/clients.json" 'j["ok"] and len(j["clients"]) == 1 and j["clients"][0]["regions"] == 1 and j["clients"][0]["pid"] == '"$receiver" ||
	fail "clients does not show the receiver"
ctl decode --json regions >"$T/regions.json" || fail "rdmaxctl regions"
json_check "$T/regions.json" 'len(j["regions"]) == 1 and j["regions"][0]["access"] == "remote-write" and j["regions"][0]["client_id"] == '"$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["clients"][0]["id"])' "$T/clients.json")" ||
	fail "regions does not show the receiver's region"
ctl decode clients >"$T/clients.txt" || fail "rdmaxctl clients"
grep -q 'REGISTERED' "$T/clients.txt" || fail "clients table has no header"
log "clients and regions: the receiver and its region"

# Jobs in flight: stop the receiving daemon, then push.
kill -STOP "$PID_decode"
"$BUILD/rdmax-demo" send --socket "$T/prefill.sock" --desc "$T/kv.desc" >"$T/send.log" 2>&1 &
sender=$!
track "$sender"
wait_for 100 sh -c "'$RDMAXCTL' --socket '$T/prefill-admin.sock' --json jobs | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)[\"jobs\"] else 1)'" ||
	fail "no job in flight while the peer is stopped"
ctl prefill --json jobs >"$T/jobs.json"
json_check "$T/jobs.json" 'all(x["op"] == "write" and x["peer"] == "127.0.0.1:'"$decode_port"'" and x["client"] == "demo-prefill" and x["age_ms"] >= 0 and "imm" in x for x in j["jobs"]) and j["jobs_in_flight"] >= len(j["jobs"])' ||
	fail "jobs in flight are not described"
ctl prefill jobs >"$T/jobs.txt" || fail "rdmaxctl jobs"
grep -q 'demo-prefill' "$T/jobs.txt" || fail "jobs table does not name the client"
ctl prefill --json conns >"$T/conns.json"
json_check "$T/conns.json" 'len(j["conns"]) >= 1 and j["conns"][0]["peer"] == "127.0.0.1:'"$decode_port"'" and j["conns"][0]["direction"] == "out"' ||
	fail "conns does not show the connection to decode"
log "jobs: $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["jobs"]))' "$T/jobs.json") in flight towards a stopped peer"

# Drain that cannot finish while the peer is stopped: exit 1, drained false.
rc=0
ctl prefill --json drain --timeout 0.3 >"$T/drain1.json" || rc=$?
[ "$rc" -eq 1 ] || fail "drain with jobs stuck returned $rc, expected 1"
json_check "$T/drain1.json" 'j["ok"] and j["drained"] is False and j["draining"] and j["jobs_in_flight"] > 0' ||
	fail "drain did not report the stuck jobs"
ctl prefill --json status >"$T/status-draining.json"
json_check "$T/status-draining.json" 'j["state"] == "draining"' || fail "status does not say draining"
kill -CONT "$PID_decode"
ctl prefill drain --timeout 30 >"$T/drain2.txt" || fail "drain after the peer came back failed: $(cat "$T/drain2.txt")"
grep -q '^drained' "$T/drain2.txt" || fail "drain text: $(cat "$T/drain2.txt")"
wait "$sender" || fail "sender failed: $(cat "$T/send.log")"
wait "$receiver" || fail "receiver failed: $(cat "$T/receive.log")"
log "drain: refused to finish while jobs were stuck, finished once the peer answered"

# While draining, new jobs are refused with a message that says why.
"$BUILD/rdmax-demo" send --socket "$T/prefill.sock" --desc "$T/kv.desc" --timeout-ms 5000 >"$T/send2.log" 2>&1 &&
	fail "a job was accepted while draining"
grep -q 'draining' "$T/send2.log" || fail "refused jobs do not say the daemon is draining: $(head -3 "$T/send2.log")"
ctl prefill resume >"$T/resume.txt" || fail "rdmaxctl resume"
grep -q 'accepting new jobs' "$T/resume.txt" || fail "resume"
ctl prefill --json status >"$T/status-resumed.json"
json_check "$T/status-resumed.json" 'j["state"] == "running" and j["jobs_total"] >= 259' || fail "status after resume"
log "drain: new jobs refused while draining; resume accepts them again"

# Counters and connections after the transfer.
ctl prefill --json stats >"$T/stats.json" || fail "rdmaxctl stats"
json_check "$T/stats.json" 'any(p["peer"] == "127.0.0.1:'"$decode_port"'" and p["write_ok"] >= 259 and p["write_bytes"] >= 28 << 20 for p in j["counters"]["peers"]) and j["counters"]["imm_writes_total"] >= 259' ||
	fail "stats do not count the transfer"
ctl prefill --json conns >"$T/conns2.json"
json_check "$T/conns2.json" 'j["conns"][0]["state"] == "ready" and j["conns"][0]["bytes_sent"] >= 28 << 20 and j["conns"][0]["node"] == "decode" and j["conns"][0]["lane"] == ""' ||
	fail "conns after the transfer (a bulk-lane connection, no lane named)"
ctl decode --json stats >"$T/stats-decode.json"
json_check "$T/stats-decode.json" 'j["counters"]["imm_fired_total"] == 1' || fail "decode did not count the fired imm"
log "stats and conns: 28 MiB to decode counted on both sides"

# Peer reset by node name closes the connection; an unknown peer is an error.
ctl prefill --json peer reset decode >"$T/reset.json" || fail "peer reset failed: $(cat "$T/reset.json")"
json_check "$T/reset.json" 'j["closed"] == 1' || fail "peer reset closed nothing"
ctl prefill --json conns >"$T/conns3.json"
json_check "$T/conns3.json" 'not any(c["state"] == "ready" and c["node"] == "decode" for c in j["conns"])' ||
	fail "connection still up after peer reset"
rc=0
ctl prefill peer reset 10.255.255.1:1 2>"$T/reset-err.txt" || rc=$?
[ "$rc" -eq 1 ] || fail "peer reset of an unknown peer returned $rc, expected 1"
grep -q "no connection to '10.255.255.1:1'" "$T/reset-err.txt" || fail "unknown peer message: $(cat "$T/reset-err.txt")"
grep -q 'reset by the administrator' "$T/prefill.log" || fail "reset not logged"
log "peer reset: by node name; unknown peer -> exit 1"

# Every subcommand, as a table and as JSON from the same reply.
for cmd in status devices clients regions conns jobs stats config resume "stats --prometheus"; do
	# shellcheck disable=SC2086
	ctl prefill $cmd >"$T/out.txt" || fail "rdmaxctl $cmd failed"
	[ -s "$T/out.txt" ] || fail "rdmaxctl $cmd printed nothing"
	# shellcheck disable=SC2086
	ctl prefill --json $cmd >"$T/out.json" || fail "rdmaxctl --json $cmd failed"
	want=${cmd%% *}
	json_check "$T/out.json" 'j["ok"] is True and j["command"] == "'"$want"'"' || fail "rdmaxctl --json $cmd"
done
ctl prefill devices >"$T/devices.txt" || fail "rdmaxctl devices"
grep -q 'TCP transport' "$T/devices.txt" || fail "devices does not say the TCP transport uses no device"
json_check "$T/out.json" '"# TYPE rdmaxd_jobs_total counter" in j["prometheus"]' || fail "prometheus text missing"
log "every subcommand: table and JSON"

# Exit codes for usage and connection errors.
rc=0
"$RDMAXCTL" --socket "$T/nothing.sock" status 2>"$T/err.txt" || rc=$?
[ "$rc" -eq 2 ] || fail "missing socket gave $rc, expected 2"
grep -q 'is rdmaxd running' "$T/err.txt" || fail "missing socket message: $(cat "$T/err.txt")"
rc=0
"$RDMAXCTL" frobnicate 2>/dev/null || rc=$?
[ "$rc" -eq 2 ] || fail "unknown command gave $rc, expected 2"
rc=0
"$RDMAXCTL" --bogus status 2>/dev/null || rc=$?
[ "$rc" -eq 2 ] || fail "unknown option gave $rc, expected 2"
log "exit codes: 2 for usage and connection errors"

# Permissions: the admin socket is 0660, and the daemon checks peers again.
[ "$(id -u)" -eq 0 ] || skip "the permission checks need root (to act as nobody)"
command -v setpriv >/dev/null || skip "setpriv is not installed"
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
[ "$(stat -c %a "$T/prefill-admin.sock")" = 660 ] || fail "admin socket mode is $(stat -c %a "$T/prefill-admin.sock")"
rc=0
as_nobody "$RDMAXCTL" --socket "$T/prefill-admin.sock" status 2>"$T/deny1.txt" || rc=$?
[ "$rc" -eq 2 ] || fail "nobody on a 0660 socket got $rc, expected 2"
grep -q 'permission denied' "$T/deny1.txt" || fail "message: $(cat "$T/deny1.txt")"
chmod 0666 "$T/prefill-admin.sock"
rc=0
as_nobody "$RDMAXCTL" --socket "$T/prefill-admin.sock" --json status >"$T/deny2.json" || rc=$?
[ "$rc" -eq 1 ] || fail "nobody on a 0666 socket got $rc, expected 1 (refused by the daemon)"
json_check "$T/deny2.json" 'j["ok"] is False and j["code"] == "PERMISSION_DENIED" and "rdmaxd-admin" in j["error"]' ||
	fail "the daemon did not refuse nobody clearly"
grep -q 'admin: refused pid .* uid 65534' "$T/prefill.log" || fail "refusal not logged"
log "permission: nobody refused by the socket mode (exit 2) and by the daemon (exit 1)"

# Members of rdmaxd-admin are let in (group created for the test when missing).
created_group=0
if ! getent group rdmaxd-admin >/dev/null; then
	command -v groupadd >/dev/null || skip "groupadd is not installed"
	groupadd --system rdmaxd-admin
	created_group=1
fi
trap '_cleanup; [ $created_group = 1 ] && groupdel rdmaxd-admin 2>/dev/null; true' EXIT
gid=$(getent group rdmaxd-admin | cut -d: -f3)
start_daemon grouped
[ "$(stat -c %G "$T/grouped-admin.sock")" = rdmaxd-admin ] || fail "admin socket not owned by group rdmaxd-admin"
setpriv --reuid=nobody --regid=nogroup --groups="$gid" "$RDMAXCTL" --socket "$T/grouped-admin.sock" status >/dev/null ||
	fail "a member of rdmaxd-admin was refused"
log "permission: a member of rdmaxd-admin is allowed"

stop_daemon grouped
stop_daemon prefill
stop_daemon decode
[ ! -e "$T/prefill-admin.sock" ] || fail "the admin socket it bound itself was left behind"
