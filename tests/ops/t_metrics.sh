#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prometheus output after real traffic passes `promtool check metrics`, counts
# what moved, and the node_exporter textfile is written atomically on a timer.
source "$(dirname "$0")/lib.sh"

[ -x "$BUILD/rdmax-demo" ] || skip "$BUILD/rdmax-demo is not built"
promtool=$(find_promtool) || skip "promtool unavailable (not in PATH and Debian's prometheus package could not be downloaded)"

mkdir -p "$T/textfile"
start_daemon prefill --set metrics.textfile_dir="$T/textfile" --set metrics.textfile_interval_s=1
start_daemon decode

"$BUILD/rdmax-demo" receive --socket "$T/decode.sock" --desc "$T/kv.desc" >"$T/receive.log" 2>&1 &
receiver=$!
track "$receiver"
"$BUILD/rdmax-demo" send --socket "$T/prefill.sock" --desc "$T/kv.desc" >"$T/send.log" 2>&1 ||
	fail "transfer failed: $(cat "$T/send.log")"
wait "$receiver" || fail "receiver failed: $(cat "$T/receive.log")"

for d in prefill decode; do
	ctl "$d" stats --prometheus >"$T/$d.prom" || fail "rdmaxctl stats --prometheus on $d"
	out=$("$promtool" check metrics <"$T/$d.prom" 2>&1) || fail "promtool check metrics on $d: $out"
	[ -z "$out" ] || fail "promtool linted $d: $out"
done
log "promtool check metrics: clean on both daemons after traffic"

grep -q '^rdmaxd_jobs_total{op="write",status="ok"} 259$' "$T/prefill.prom" || fail "write jobs not counted"
grep -q '^rdmaxd_job_duration_seconds_count{op="write"} 259$' "$T/prefill.prom" || fail "latency histogram count"
grep -q '^rdmaxd_job_duration_seconds_bucket{op="write",le="+Inf"} 259$' "$T/prefill.prom" || fail "latency +Inf bucket"
grep -q '^rdmaxd_job_bytes_total{op="write",status="ok"} 29360128$' "$T/prefill.prom" || fail "bytes not counted"
grep -q '^rdmaxd_peer_bytes_total{peer="127.0.0.1:[0-9]*",op="write"} 29360128$' "$T/prefill.prom" || fail "per-peer bytes"
grep -q '^rdmaxd_connection_events_total{transport="tcp",event="established"} 1$' "$T/prefill.prom" || fail "connection events"
grep -q '^rdmaxd_imm_writes_total 259$' "$T/prefill.prom" || fail "imm writes"
grep -q '^rdmaxd_imm_fired_total 1$' "$T/decode.prom" || fail "imm fired on decode"
grep -q '^rdmaxd_registrations_total 1$' "$T/decode.prom" || fail "registrations on decode"
log "counters: 259 writes, 28 MiB, one connection, imm counted on both sides"

# A client session shows up with its own labels while connected.
"$BUILD/rdmax-demo" receive --socket "$T/decode.sock" --desc "$T/kv2.desc" --timeout-ms 20000 >/dev/null 2>&1 &
track $!
wait_for 100 test -s "$T/kv2.desc" || fail "second receiver did not start"
ctl decode stats --prometheus >"$T/decode2.prom"
grep -q '^rdmaxd_client_registered_bytes{client="demo-decode",pid="[0-9]*",session="[0-9]*"} 29360128$' "$T/decode2.prom" ||
	fail "per-client gauge missing"
out=$("$promtool" check metrics <"$T/decode2.prom" 2>&1) || fail "promtool with a client: $out"
log "per-client series present and valid"

# Textfile: rewritten every second, valid, never a partial file with a .prom name.
wait_for 50 test -s "$T/textfile/rdmaxd.prom" || fail "no textfile written"
# Fresh: a rewrite after the last job shows its count (the interval is one second).
wait_for 100 grep -q '^rdmaxd_jobs_total{op="write",status="ok"} 259$' "$T/textfile/rdmaxd.prom" ||
	fail "textfile is stale"
written=$(stat -c %.9Y "$T/textfile/rdmaxd.prom")
wait_for 50 sh -c "[ \"\$(stat -c %.9Y '$T/textfile/rdmaxd.prom')\" != '$written' ]" ||
	fail "textfile not rewritten within 5 s (interval 1 s)"
out=$("$promtool" check metrics <"$T/textfile/rdmaxd.prom" 2>&1) || fail "promtool on the textfile: $out"
leftovers=$(find "$T/textfile" -type f ! -name rdmaxd.prom)
[ -z "$leftovers" ] || fail "temporary files left in the textfile directory: $leftovers"
log "textfile collector file: fresh, valid, written atomically"
