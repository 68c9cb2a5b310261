#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# scaling.sh - the scaling part of `make bench` (issue: how bandwidth and job
# rate change with 1, 2, 4, 8 client processes on one daemon, and the
# daemon's memory idle and under load). Two rdmaxd on loopback over the TCP
# transport; N rdmax-bench processes on daemon a write concurrently into one
# region served on daemon b, first 1 MiB jobs (bandwidth), then 64 B jobs
# (job rate). Daemon a's RSS (VmRSS) is read idle, then sampled every 50 ms
# under load. Results go to $RDMAX_BENCH_OUT (build/bench):
#   host-scale-TEST-N-pI.json   rdmax-bench --json of process I of N
#   host-scale-rss.json         {"idle_kib", "peak_kib": {"bw-N": ...}, "after_kib"}
# tests/bench/report.py prints them as the scaling table.
#
# Environment: RDMAX_BUILD (build), RDMAX_BENCH_OUT, RDMAX_BENCH_SECONDS (1),
# RDMAX_BENCH_CLIENTS ("1 2 4 8").
set -u

build=${RDMAX_BUILD:-build}
out=${RDMAX_BENCH_OUT:-$build/bench}
secs=${RDMAX_BENCH_SECONDS:-1}
clients=${RDMAX_BENCH_CLIENTS:-1 2 4 8}
run=$(mktemp -d /tmp/rdmax-scale.XXXXXX) || exit 1
pids=()
failed=0

cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	pids=()
	rm -rf "$run"
}
trap cleanup EXIT

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

. "$(dirname "$0")/lib.sh"

mkdir -p "$out" || exit 1
rm -f "$out"/host-scale-*
start_daemon a "scaling" && start_daemon b "scaling" || exit 1
apid=${pids[0]}
"$build/rdmax-bench" serve --socket "$run/b.sock" --desc "$run/b.desc" --size 8M \
	2>"$run/serve.log" &
pids+=($!)
for ((i = 0; i < 100; i++)); do
	[ -s "$run/b.desc" ] && break
	sleep 0.05
done
sleep 0.2
idle=$(rss_kib "$apid")
peaks=""

# TEST SIZE WINDOW BATCH
for item in "bw 1048576 16 8" "rate 64 64 16"; do
	read -r test size window batch <<<"$item"
	for n in $clients; do
		peak=0
		cpids=()
		for ((p = 1; p <= n; p++)); do
			"$build/rdmax-bench" run --socket "$run/a.sock" --desc "$run/b.desc" -o write \
				-s "$size" -w "$window" -b "$batch" -D "$secs" --no-verify \
				--label "scale $test $n" \
				--json="$out/host-scale-$test-$n-p$p.json" >"$run/c$p.out" 2>&1 &
			cpids+=($!)
		done
		while kill -0 "${cpids[0]}" 2>/dev/null; do
			r=$(rss_kib "$apid")
			[ "$r" -le "$peak" ] || peak=$r
			sleep 0.05
		done
		for ((p = 0; p < n; p++)); do
			if ! wait "${cpids[$p]}"; then
				echo "scaling: $test with $n clients: client $((p + 1)) failed:" \
					"$(tail -n 2 "$run/c$((p + 1)).out" | tr '\n' ' ')"
				failed=1
			fi
		done
		peaks="$peaks${peaks:+, }\"$test-$n\": $peak"
		echo "host: scaling $test $n client(s) done"
	done
done
after=$(rss_kib "$apid")
echo "{\"idle_kib\": $idle, \"peak_kib\": {$peaks}, \"after_kib\": $after}" \
	>"$out/host-scale-rss.json"
exit $failed
