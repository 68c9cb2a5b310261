#!/bin/bash
# SPDX-License-Identifier: MIT
# Inside one two-node Soft-RoCE guest: the rows of RDMAX_BENCH_ONLY (default
# the 64 B completed write, `write_rtt`, with its perftest and UCX
# references) for two builds, interleaved: ROUNDS rounds, each running both
# builds' guest.sh (one repetition) in alternating order. Results go to
# $RDMAX_BENCH_OUT/{old,new}-rN, each readable with tests/bench/report.py.
#
#   tests/vm/run-in-guest --two-nodes -e RDMAX_AB_OLD=build/old -- tests/bench/ab-guest.sh
#
# RDMAX_AB_OLD / RDMAX_AB_NEW: build folders (rdmaxd, rdmax-bench and its
# librdmax.so.2, which it finds next to itself);
# RDMAX_AB_ROUNDS (3); RDMAX_BENCH_PERF=1 profiles the last round.
#
# RDMAX_AB_VARIANTS instead compares settings of one build (RDMAX_AB_NEW):
# space-separated LABEL[:NAME=VALUE[,NAME=VALUE...]], each run with those
# variables in its environment (the client library's RDMAX_SPIN_*, or
# RDMAX_BENCH_DAEMON_SET for both daemons), every variant once per round
# and each round starting one variant later; results in $RDMAX_BENCH_OUT/LABEL-rN.
#
#   tests/vm/run-in-guest --two-nodes -e RDMAX_AB_VARIANTS='yield pause:RDMAX_SPIN_YIELD=0' \
#       -- tests/bench/ab-guest.sh
set -uo pipefail

new=${RDMAX_AB_NEW:-build}
variants=${RDMAX_AB_VARIANTS:-}
[ -n "$variants" ] || old=${RDMAX_AB_OLD:?build folder of the old rdmaxd}
rounds=${RDMAX_AB_ROUNDS:-3}
out=${RDMAX_BENCH_OUT:-build/bench-ab}
export RDMAX_BENCH_ONLY=${RDMAX_BENCH_ONLY:-write_rtt}
export RDMAX_BENCH_REPS=1
perf=${RDMAX_BENCH_PERF:-0}

one() { # LABEL BUILD ROUND [NAME=VALUE,...]
	local -a env=()
	[ -n "${4:-}" ] && IFS=, read -r -a env <<<"$4"
	echo "ab-guest: round $3 $1 ($2${4:+ $4}), load $(cut -d' ' -f1-3 /proc/loadavg)"
	env "${env[@]}" RDMAX_BUILD="$2" RDMAX_BENCH_OUT="$out/$1-r$3" tests/bench/guest.sh \
		>"$out/$1-r$3.log" 2>&1
	echo "ab-guest: round $3 $1 exit $?"
	grep -h '^guest: \(rdmax write\|ib_write_bw\|ucx_perftest\|verbs-hop\)' "$out/$1-r$3.log" | sed 's/^/  /'
}

mkdir -p "$out"
read -r -a vs <<<"$variants"
for r in $(seq "$rounds"); do
	export RDMAX_BENCH_PERF=0
	[ "$r" = "$rounds" ] && export RDMAX_BENCH_PERF=$perf
	if [ "${#vs[@]}" -gt 0 ]; then
		for ((i = 0; i < ${#vs[@]}; i++)); do
			v=${vs[$(((i + r - 1) % ${#vs[@]}))]}
			label=${v%%:*}
			set_env=''
			[ "$v" != "$label" ] && set_env=${v#*:}
			one "$label" "$new" "$r" "$set_env"
		done
	elif [ $((r % 2)) = 1 ]; then
		one old "$old" "$r"
		one new "$new" "$r"
	else
		one new "$new" "$r"
		one old "$old" "$r"
	fi
done
