#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# SIGHUP re-reads the configuration file given at start-up with the
# command-line overrides still on top, applies the keys that can change at run
# time, names the ones that need a restart, and survives a broken file.
source "$(dirname "$0")/lib.sh"

conf=$T/rdmaxd.conf
cat >"$conf" <<CONF
[daemon]
log_level = info
[limits]
max_clients = 100
max_regions = 50
[peers]
idle_timeout_s = 300
[engine]
chunk_bytes = 1M
CONF
start_daemon r -c "$conf" --set limits.max_clients=7

cfg_value() { ctl r config | sed -n "s/^$1 = //p"; }
[ "$(cfg_value max_clients)" = 7 ] || fail "override not applied at start"

# An unchanged file: nothing to report.
kill -HUP "$PID_r"
wait_for 50 grep -q 'configuration reloaded' "$T/r.log" || fail "no reload after SIGHUP"
grep -q 'after a restart' "$T/r.log" && fail "an unchanged file reported restart-only changes"

cat >"$conf" <<CONF
[daemon]
log_level = debug
[limits]
max_clients = 200
max_regions = 5
[peers]
idle_timeout_s = 42
[engine]
chunk_bytes = 2M
CONF
: >"$T/r.log.mark"
n0=$(grep -c 'configuration reloaded' "$T/r.log")
kill -HUP "$PID_r"
wait_for 50 sh -c "[ \$(grep -c 'configuration reloaded' '$T/r.log') -gt $n0 ]" || fail "no second reload"
[ "$(cfg_value log_level)" = debug ] || fail "log level not applied"
[ "$(cfg_value max_regions)" = 5 ] || fail "max_regions not applied"
[ "$(cfg_value idle_timeout_s)" = 42 ] || fail "idle_timeout_s not applied"
[ "$(cfg_value max_clients)" = 7 ] || fail "the command-line override was lost on reload"
[ "$(cfg_value chunk_bytes)" = 1M ] || fail "chunk_bytes changed without a restart"
grep -q 'log level info -> debug' "$T/r.log" || fail "log level change not logged"
grep -q '\[engine\] chunk_bytes changed; it takes effect only after a restart' "$T/r.log" ||
	fail "restart-only key not named"
ctl r --json status >"$T/status.json"
json_check "$T/status.json" 'j["log_level"] == "debug"' || fail "status log level"
log "reload: run-time keys applied, override kept, restart-only key named"

# A broken file: the reload fails, the daemon keeps running unchanged.
echo "this is not ini" >>"$conf"
kill -HUP "$PID_r"
wait_for 50 grep -q 'reload failed' "$T/r.log" || fail "a broken file was not reported"
[ "$(cfg_value max_regions)" = 5 ] || fail "configuration changed by a failed reload"
ctl r status >/dev/null || fail "daemon not answering after a failed reload"
log "reload: a broken file leaves the running configuration alone"

# A key file that is not private is refused and the previous key kept.
printf 'a-shared-key-of-enough-length\n' >"$T/key"
chmod 0644 "$T/key"
sed -i '$d' "$conf"
printf '[auth]\nkey_file = %s\n' "$T/key" >>"$conf"
kill -HUP "$PID_r"
wait_for 50 grep -q 'keeping the previous key' "$T/r.log" || fail "insecure key file accepted"
ctl r --json status >"$T/status2.json"
json_check "$T/status2.json" 'j["authentication"] is False' || fail "authentication state changed"
chmod 0600 "$T/key"
kill -HUP "$PID_r"
wait_for 50 grep -q 'authentication key replaced' "$T/r.log" || fail "key not loaded on reload"
ctl r --json status >"$T/status3.json"
json_check "$T/status3.json" 'j["authentication"] is True' || fail "authentication not on after reload"
log "reload: key file checked; a bad one keeps the previous key"
stop_daemon r
