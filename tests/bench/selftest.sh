#!/bin/bash
# SPDX-License-Identifier: MIT
# The benchmark's own arithmetic, run by `make check`: tcp-stream reports each
# end's CPU and wait, and report.py's sender line splits tcp@1MiB into share x
# cost from the JSON that rdmax-bench and tcp-stream write, and tcp_vs_best takes
# the fastest stream reference, and the KV rows' CPU account adds every process of
# the row per GB against the references' two ends and the raw relays', and qos_summary.py
# sets rdmax's p99 against the relayed raw ping-pong's beside the same load. Fixture files
# with known figures, so every printed factor is checked, one short real stream, one
# short real KV row between two daemons and one over the raw relays, and the wake-up
# probe.
set -eu
build=${RDMAX_BUILD:-build}
dir=$(mktemp -d /tmp/rdmax-bench-selftest.XXXXXX)
run=$dir/run
pids=()
mkdir -p "$run"
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
fail() {
	echo "bench selftest: $*" >&2
	exit 1
}

# A real stream: both ends' CPU and waits are in the JSON.
"$build/tests/bench/tcp-stream" -s 64K -n 2000 --spin --json >"$dir/stream.json" ||
	fail "tcp-stream failed"
"${PYTHON:-python3}" - "$dir/stream.json" <<'PY' || fail "tcp-stream JSON lacks an end's CPU or wait"
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
for k in ("send_cpu_s", "recv_cpu_s", "send_wait_s", "recv_wait_s"):
    assert r[k] >= 0, k
assert r["send_cpu_s"] > 0 and r["recv_cpu_s"] > 0, r
assert abs(r["cpu_s_per_GB"] * r["jobs"] * r["bytes"] / 1e9
           - (r["send_cpu_s"] + r["recv_cpu_s"])) < 0.01, r
PY

# --recv-cpu: the receiving process (beyond a relay) ends the stream on the CPU it was
# given, not on the sending end's (qos.sh's layout of one node per CPU). The sending end
# runs on CPU 0, so with two CPUs or more a receiver that kept its parent's CPUs would end
# on CPU 0 and fail the check.
last_cpu=$(($(nproc) - 1))
taskset -c 0 "$build/tests/bench/tcp-stream" --lat --relay -s 4K -n 200 --json \
	--recv-cpu "$last_cpu" >"$dir/stream-cpu.json" || fail "tcp-stream --recv-cpu failed"
for key in recv_cpu recv_last_cpu; do
	grep -q "\"$key\": $last_cpu}" "$dir/stream-cpu.json" ||
		fail "tcp-stream --recv-cpu $last_cpu, $key: $(cat "$dir/stream-cpu.json")"
done
if "$build/tests/bench/tcp-stream" --recv-cpu x -n 1 >/dev/null 2>"$dir/stream-cpu.err"; then
	fail "tcp-stream --recv-cpu x ran"
fi
grep -q "bad --recv-cpu 'x'" "$dir/stream-cpu.err" || fail "tcp-stream --recv-cpu x: $(cat "$dir/stream-cpu.err")"

# A KV row's JSON (rdmax's or the relays', TRANSPORT): every byte checked, every process's
# CPU per GB and runs per request in it.
kv_json_ok() { # FILE TRANSPORT
	"${PYTHON:-python3}" - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["results"][0]
assert d["params"]["claims"] == "standing", d["params"]
assert d["params"]["transport"] == sys.argv[2], d["params"]
assert r["verify"] == "ok" and r["jobs"] > 0, r
for k in ("daemon_cpu_s_per_GB", "peer_cpu_s_per_GB", "prefill_cpu_s_per_GB",
          "decode_cpu_s_per_GB", "check_cpu_s_per_GB"):
    assert r[k] > 0, k
# Every request wakes the decode client at least once; the daemons (relays) run for it.
runs = r["runs_per_request"]
assert runs["decode"] > 0 and runs["daemon"] > 0 and runs["peer"] > 0, runs
sleeps = r["sleeps_per_request"]
assert sleeps["daemon"] >= 0 and sleeps["peer"] >= 0, sleeps
assert 0 <= r["host_idle"] <= 1, r
PY
}

# A real KV row: every process's CPU per GB and runs per request are in the JSON.
. "$(dirname "$0")/lib.sh"
start_daemon a "bench selftest" >&2 || fail "daemon a did not start"
start_daemon b "bench selftest" >&2 || fail "daemon b did not start"
"$build/rdmax-bench" kv --socket "$run/a.sock" --decode-socket "$run/b.sock" --one-job \
	--decode-sleep --layers 2 --blocks 8 --block-len 16K -D 0.3 --daemon-pid "${pids[0]}" \
	--peer-daemon-pid "${pids[1]}" --json="$dir/kv.json" >"$dir/kv.out" 2>&1 ||
	fail "rdmax-bench kv failed: $(tail -n 3 "$dir/kv.out")"
kv_json_ok "$dir/kv.json" rdmaxd || fail "kv JSON lacks a process's CPU or runs"

# The same row with a claim per request (--claim-each), every byte checked too.
"$build/rdmax-bench" kv --socket "$run/a.sock" --decode-socket "$run/b.sock" --one-job \
	--decode-sleep --claim-each --layers 2 --blocks 8 --block-len 16K -D 0.3 \
	--json="$dir/kv-each.json" >"$dir/kv-each.out" 2>&1 ||
	fail "rdmax-bench kv --claim-each failed: $(tail -n 3 "$dir/kv-each.out")"
"${PYTHON:-python3}" - "$dir/kv-each.json" <<'PY' || fail "kv --claim-each JSON: $(cat "$dir/kv-each.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["params"]["claims"] == "each", d["params"]
assert d["results"][0]["verify"] == "ok" and d["results"][0]["jobs"] > 0, d
PY

# The row's raw reference: the same clients over two relay processes, every byte checked,
# the relays' CPU counted where the daemons' is.
"$build/rdmax-bench" kv --relay --one-job --decode-sleep --layers 2 --blocks 8 --block-len 16K \
	-D 0.3 --json="$dir/kv-relay.json" >"$dir/kv-relay.out" 2>&1 ||
	fail "rdmax-bench kv --relay failed: $(tail -n 3 "$dir/kv-relay.out")"
kv_json_ok "$dir/kv-relay.json" relay || fail "kv --relay JSON: $(cat "$dir/kv-relay.json")"
# Relays that poll without sleeping (--relay-spin: non-blocking calls retried until the
# spin runs out, then a sleeping one), here for longer than the run: every byte still
# checked, and the relays never went to sleep while the clients ran, where the sleeping
# relays above did (0.16-0.74 times per request on this 2-vCPU machine).
"$build/rdmax-bench" kv --relay --relay-spin 1000000 --one-job --decode-sleep --layers 2 \
	--blocks 8 --block-len 16K -D 0.3 --json="$dir/kv-relay-spin.json" \
	>"$dir/kv-relay-spin.out" 2>&1 ||
	fail "rdmax-bench kv --relay --relay-spin failed: $(tail -n 3 "$dir/kv-relay-spin.out")"
kv_json_ok "$dir/kv-relay-spin.json" relay ||
	fail "kv --relay --relay-spin JSON: $(cat "$dir/kv-relay-spin.json")"
grep -q '"relay_spin_us": 1000000,' "$dir/kv-relay-spin.json" ||
	fail "kv --relay --relay-spin: the JSON does not say the relays spun"
"${PYTHON:-python3}" - "$dir/kv-relay.json" "$dir/kv-relay-spin.json" <<'PY' ||
import json, sys
sleeping, spinning = (json.load(open(f))["results"][0]["sleeps_per_request"] for f in sys.argv[1:])
assert sleeping["daemon"] + sleeping["peer"] >= 0.05, ("the sleeping relays", sleeping)
assert spinning["daemon"] + spinning["peer"] <= 0.01, ("the spinning relays", spinning)
PY
	fail "kv --relay-spin: relays' sleeps per request not as expected"
if "$build/rdmax-bench" kv --relay-spin 200 --one-job -D 0.1 >"$dir/kv-relay3.out" 2>&1; then
	fail "rdmax-bench kv --relay-spin without --relay ran"
fi
grep -q 'relay-spin takes --relay' "$dir/kv-relay3.out" ||
	fail "kv --relay-spin without --relay: $(cat "$dir/kv-relay3.out")"
# Without --one-job the relays have no per-layer imm count to keep: refused by name.
if "$build/rdmax-bench" kv --relay -D 0.1 >"$dir/kv-relay2.out" 2>&1; then
	fail "rdmax-bench kv --relay without --one-job ran"
fi
grep -q 'relay takes --one-job' "$dir/kv-relay2.out" ||
	fail "kv --relay without --one-job: $(cat "$dir/kv-relay2.out")"

# The wake-up probe: two processes sleeping in read(), one byte each way.
"$build/tests/bench/shm-pingpong" --pipe --cpus 0,0 -n 200 --json >"$dir/pipe.json" ||
	fail "shm-pingpong --pipe failed"
"${PYTHON:-python3}" - "$dir/pipe.json" <<'PY' || fail "shm-pingpong --pipe: $(cat "$dir/pipe.json")"
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
assert r["mode"] == "pipe" and r["iters"] == 200, r
assert 0 < r["lat_us"]["p50"] <= r["lat_us"]["p99"], r
PY

# Fixtures: rdmax's sending daemon ran 0.8 s of 1 s at 0.1 s/GB (8 GB/s), the stream's
# sender 1.0 s at 0.1 s/GB (10 GB/s): tcp@1MiB 0.80 = share 0.80 x cost 1.00. A second pair
# at 0.9 s / 0.09 s/GB and 1.0 s / 0.1: share 0.90 x cost 1.11.
mkdir -p "$dir/out"
row() { # FILE GBPS RUN WAIT IDLE (rdmax) | FILE GBPS SEND_CPU SEND_WAIT (stream)
	if [ "$#" = 5 ]; then
		printf '{"status": "ok", "label": "host tcp_write", "results": [{"bytes": 1048576, "seconds": 1.0, "Gbps": %s, "jobs_per_s": 1, "lat_us": {"p50": 0, "p99": 0, "p999": 0, "mean": 0}, "daemon_cpu_s_per_GB": 0.1, "peer_cpu_s_per_GB": 0.1, "daemon_run_s": %s, "daemon_wait_s": %s, "host_idle": %s}]}\n' \
			"$2" "$3" "$4" "$5" >"$1"
	else
		printf '{"status": "ok", "label": "host tcp_write spin", "results": [{"bytes": 1048576, "seconds": 1.0, "Gbps": %s, "jobs_per_s": 1, "lat_us": {"p50": 0, "p99": 0, "p999": 0, "mean": 0}, "cpu_s_per_GB": 0.2, "send_cpu_s": %s, "send_wait_s": %s, "recv_cpu_s": 1.0, "recv_wait_s": 0}]}\n' \
			"$2" "$3" "$4" >"$1"
	fi
}
row "$dir/out/host-rdmax-tcp_write-1048576-r1.json" 64 0.8 0.2 0.05
row "$dir/out/host-ref@spin-tcp_write-1048576-r1.json" 80 1.0 0.0
row "$dir/out/host-rdmax-tcp_write-1048576-r2.json" 80 0.9 0.1 0.05
row "$dir/out/host-ref@spin-tcp_write-1048576-r2.json" 80 1.0 0.0
# The blocking stream, faster here than the spinning one, is a reference of tcp_vs_best.
row "$dir/out/host-ref-tcp_write-1048576-r1.json" 100 1.0 0.0
row "$dir/out/host-ref-tcp_write-1048576-r2.json" 100 1.0 0.0
# KV rows: daemons 0.15 and 0.13, prefill 0.04, decode 0.08 s/GB = 0.40, then 0.50 with
# the decode at 0.18; iperf3's ends 0.22 and 0.24, the blocking stream's through 32 MiB 0.20.
kv() { # FILE DECODE RUNS_DAEMON | FILE CPU (a reference)
	if [ "$#" = 3 ]; then
		printf '{"status": "ok", "label": "host tcp_kv", "results": [{"bytes": 2097152, "seconds": 2.0, "Gbps": 40, "jobs_per_s": 1, "lat_us": {"p50": 0, "p99": 0, "p999": 0, "mean": 0}, "daemon_cpu_s_per_GB": 0.15, "peer_cpu_s_per_GB": 0.13, "check_cpu_s_per_GB": 0.05, "prefill_cpu_s_per_GB": 0.04, "decode_cpu_s_per_GB": %s, "runs_per_request": {"prefill": 1.5, "decode": 2, "daemon": %s, "peer": 2}, "host_idle": 0.04}]}\n' \
			"$2" "$3" >"$1"
	else
		printf '{"status": "ok", "label": "host tcp_kv span", "results": [{"bytes": 1048576, "seconds": 2.0, "Gbps": 60, "jobs_per_s": 1, "lat_us": {"p50": 0, "p99": 0, "p999": 0, "mean": 0}, "cpu_s_per_GB": %s}]}\n' \
			"$2" >"$1"
	fi
}
kv "$dir/out/host-rdmax-tcp_kv-16384-r1.json" 0.08 1
kv "$dir/out/host-rdmax-tcp_kv-16384-r2.json" 0.18 2
kv "$dir/out/host-ref@span-tcp_kv-16384-r1.json" 0.20
# The raw relays: their two ends 0.10 + 0.10, their clients 0.04 + 0.08, at 50 Gb/s.
printf '{"status": "ok", "label": "host tcp_kv relay", "results": [{"bytes": 2097152, "seconds": 2.0, "Gbps": 50, "jobs_per_s": 1, "lat_us": {"p50": 0, "p99": 0, "p999": 0, "mean": 0}, "daemon_cpu_s_per_GB": 0.10, "peer_cpu_s_per_GB": 0.10, "check_cpu_s_per_GB": 0.05, "prefill_cpu_s_per_GB": 0.04, "decode_cpu_s_per_GB": 0.08, "runs_per_request": {"prefill": 1.5, "decode": 1, "daemon": 1, "peer": 2}, "host_idle": 0.1}]}\n' \
	>"$dir/out/host-ref@relay-tcp_kv-16384-r1.json"
printf '{"end": {"sum_received": {"bytes": %s, "seconds": 1.0, "bits_per_second": 8e10}, "cpu_utilization_percent": {"host_total": 110, "remote_total": 110}}}\n' \
	10000000000 >"$dir/out/host-ref@iperf3-tcp_kv-16384-r1.json"
printf '{"end": {"sum_received": {"bytes": %s, "seconds": 1.0, "bits_per_second": 8e10}, "cpu_utilization_percent": {"host_total": 120, "remote_total": 120}}}\n' \
	10000000000 >"$dir/out/host-ref@iperf3-tcp_kv-16384-r2.json"
echo cubic >"$dir/out/host-tcp-cc.txt"
"${PYTHON:-python3}" tests/bench/report.py "$dir/out" >"$dir/report.txt" || fail "report.py failed"
grep -q '^host rows: TCP congestion control cubic for every stream$' "$dir/report.txt" ||
	fail "report.py does not name the congestion control"
# Medians over the two pairs: rdmax share 0.85, cost 0.1 and 0.09 -> median 0.095.
"${PYTHON:-python3}" - "$dir/out/summary.json" <<'PY' || fail "sender split or tcp_vs_best wrong: $(grep sender "$dir/report.txt")"
import json, sys
s = json.load(open(sys.argv[1]))["tcp_sender"]
near = lambda a, b: abs(a - b) < 1e-3
assert near(s["rdmax_share"], 0.85) and near(s["ref_share"], 1.0), s
assert near(s["rdmax_cost"], 0.095) and near(s["ref_cost"], 0.1), s
assert near(s["share"], 0.85) and near(s["cost"], 0.1 / 0.095), s
assert near(s["rdmax_wait"], 0.15) and near(s["idle"], 0.05) and s["runs"] == 2, s
# Per pair the product is the pair's ratio: 64/80 = 0.8 x 1.0, 80/80 = 0.9 x 0.1/0.09.
(s1, c1), (s2, c2) = s["pairs"]
assert near(s1, 0.8) and near(c1, 1.0) and near(s2, 0.9) and near(c2, 0.1 / 0.09), s
assert near(s1 * c1, 64 / 80) and near(s2 * c2, 80 / 80), s
# tcp_vs_best: rdmax's median 72 Gb/s against the fastest reference, the blocking 100.
best = json.load(open(sys.argv[1]))["ratios"]["tcp_vs_best@1MiB"]
assert near(best, 0.72), best
PY
# The KV account: medians 0.15, 0.13, 0.04, decode 0.13, all 0.45; iperf3 0.23 (0.51 of the
# row's), span 0.20 (0.44 of it); the daemons 0.28 (iperf3's 0.82 of it); 7.0 runs per request.
"${PYTHON:-python3}" - "$dir/out/summary.json" <<'PY' || fail "KV account wrong: $(grep kv_tcp "$dir/report.txt")"
import json, sys
a = json.load(open(sys.argv[1]))["kv_account"]["16384"]
near = lambda x, y: abs(x - y) < 1e-3
assert near(a["daemon"], 0.15) and near(a["peer"], 0.13) and near(a["prefill"], 0.04), a
assert near(a["decode"], 0.13) and near(a["total"], 0.45) and near(a["check"], 0.05), a
assert near(a["iperf3"], 0.23) and near(a["span"], 0.20) and a["runs"] == 2, a
assert near(a["runs_per_request"], 7.0) and near(a["idle"], 0.04), a
# The relays: their ends 0.20 (0.71 of the daemons' 0.28), all their row's processes 0.32;
# rdmax's 40 Gb/s against their 50.
assert near(a["relay"], 0.20) and near(a["relay_total"], 0.32), a
r = json.load(open(sys.argv[1]))["ratios"]
assert near(r["kv_tcp_vs_relay"], 0.80), r
PY
grep -q '^kv_tcp 16 KiB blocks, .* all 0.450; iperf3.s two ends 0.23, 0.51 of the row.s; the blocking stream.s through 32 MiB 0.20, 0.44 of it; the daemons alone 0.280, iperf3.s ends 0.82 of it; processes put on a CPU per request 7.00; the raw relays. two ends 0.20, 0.71 of the daemons., all the relay row.s processes 0.32$' \
	"$dir/report.txt" || fail "KV account line: $(grep kv_tcp "$dir/report.txt")"
grep -q 'tcp@1MiB = share 0.85 x cost 1.05;.* each pair, share x cost: 0.80 x 1.00, 0.90 x 1.11$' \
	"$dir/report.txt" || fail "sender line: $(grep sender "$dir/report.txt")"
# qos_summary.py: each layout's rdmax p99 under load against the relayed raw ping-pong's
# beside the same load (the lane open; unpinned, also against the same relay waiting in
# epoll_wait()), and a verbs summary that leaves that TCP round trip
# out, though its files lie beside the verbs part's own (the guest writes where the host does).
q=$dir/qos
mkdir -p "$q"
qos_run() { # FILE P50 P99 [GBPS]
	printf '{"status": "ok", "results": [{"bytes": 65536, "seconds": 2.0, "GBps": %s, "Gbps": 0, "jobs_per_s": 1, "lat_us": {"p50": %s, "p99": %s, "p999": 0, "mean": 0}}]}\n' \
		"${4:-0.1}" "$2" "$3" >"$1"
}
for pre in host-qos guest-qos-verbs; do
	qos_run "$q/$pre-on-idle-r1.json" 50 100
	qos_run "$q/$pre-on-mixedlat-r1.json" 60 500
	qos_run "$q/$pre-on-bulk-r1.json" 0 0 5.0
	qos_run "$q/$pre-on-mixedbulk-r1.json" 0 0 4.0
done
qos_run "$q/host-qos-raw-idlerelay-r1.json" 55 80
qos_run "$q/host-qos-raw-mixedrdmaxrelay-r1.json" 50 90
qos_run "$q/host-qos-raw-mixedrdmaxiorelay-r1.json" 50 400
qos_run "$q/host-qos-raw-idlerelayep-r1.json" 55 100
qos_run "$q/host-qos-raw-mixedrdmaxiorelayep-r1.json" 52 625
"${PYTHON:-python3}" tests/bench/qos_summary.py "$q" 1 0 0 0 host-qos TCP >"$dir/qos-tcp.txt" ||
	fail "qos_summary.py failed over TCP"
for line in 'p99 under load / idle p99 = 5.00 (target <= 2)   bulk with / without latency = 0.80' \
	'relayed ping-pong unpinned, lane open, + bulk p50 50.0 us (50.0)   p99 400.0 us (400.0)' \
	'its p99 under load / idle p99 = 5.00 (the same layout' \
	"rdmax's p99 under load / the relayed ping-pong's = 1.25" \
	'relayed  ping-pong + rdmax    bulk   p50 50.0 us (50.0)   p99 90.0 us (90.0)' \
	'raw relayed  ping-pong, rdmax-io load: p50 0.9x, p99 5.0x; rdmax / raw: p50 1.32, p99 1.00' \
	'relayed ping-pong in epoll_wait() unpinned, lane open, + bulk p50 52.0 us (52.0)   p99 625.0 us (625.0)' \
	'its p99 under load / idle p99 = 6.25 (the same layout' \
	"rdmax's p99 under load / the relayed ping-pong in epoll_wait()'s = 0.80" \
	'raw relayed (epoll) ping-pong, rdmax-io load: p50 0.9x, p99 6.2x; rdmax / raw: p50 1.27, p99 0.80'; do
	grep -qF "$line" "$dir/qos-tcp.txt" || fail "qos summary over TCP lacks: $line"
done
"${PYTHON:-python3}" tests/bench/qos_summary.py "$q" 1 0 0 0 guest-qos-verbs verbs >"$dir/qos-verbs.txt" ||
	fail "qos_summary.py failed over verbs"
grep -qF 'p99 under load / idle p99 = 5.00 (target <= 2)' "$dir/qos-verbs.txt" ||
	fail "qos summary over verbs lacks its own ratio"
if grep -q 'relayed' "$dir/qos-verbs.txt"; then
	fail "qos summary over verbs prints the TCP relayed ping-pong: $(grep relayed "$dir/qos-verbs.txt")"
fi
echo "bench selftest: ok"
