#!/bin/bash
# SPDX-License-Identifier: MIT
# Small-job latency of two rdmaxd builds, interleaved on this host: the
# client -> daemon -> client ring hop (`rdmax-bench local --lat`, 64 B) and a
# completed 64 B write over the TCP transport between two daemons
# (`rdmax-bench run --lat`). Each repetition runs both builds back to back,
# in alternating order, and prints one line per build and test with p50/p99
# and the load average, so that a drift of the machine hits both.
#
#   tests/bench/ab-lat.sh OLD_RDMAXD NEW_RDMAXD [REPS] [ITERS]
#
# Each build runs with its own rdmax-bench and librdmax (the ones next to its
# rdmaxd, when there are), so a change on either side of the ring counts.
# Each repetition ends with the floor: tests/bench/shm-pingpong, two
# processes moving the ring's cache lines (`ring`) and one line each way
# (`line`) with nothing else, pinned like the builds.
#
# RDMAX_ABLAT_PIN=1 pins the client to CPU 0 and the daemons to CPU 1
# (taskset), so that a spinning client and its daemon never share a CPU;
# RDMAX_ABLAT_SET="section.key=value" is passed to every daemon as --set;
# RDMAX_ABLAT_ENV_OLD / RDMAX_ABLAT_ENV_NEW ("NAME=VALUE ...") go into the
# environment of that side's client, e.g. the library's RDMAX_SPIN_* to
# compare two client waits with one rdmaxd given twice.
set -euo pipefail

old=${1:?old rdmaxd}
new=${2:?new rdmaxd}
reps=${3:-5}
iters=${4:-5000}
root=$(cd "$(dirname "$0")/../.." && pwd)
bench=$root/build/rdmax-bench
pingpong=$root/build/tests/bench/shm-pingpong
dir=$(mktemp -d /tmp/rdmax-ablat.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT

# start_daemon NAME BIN: a TCP daemon on 127.0.0.1 with its socket in $dir
pin_daemon=()
pin_client=()
if [ "${RDMAX_ABLAT_PIN:-0}" = 1 ]; then
	pin_daemon=(taskset -c 1)
	pin_client=(taskset -c 0)
fi

start_daemon() {
	"${pin_daemon[@]}" "$2" --node-name "$1" --socket "$dir/$1.sock" --transport tcp --listen 127.0.0.1 \
		--port 0 -L warning ${RDMAX_ABLAT_SET:+--set "$RDMAX_ABLAT_SET"} &
	pids+=($!)
	for _ in $(seq 100); do [ -S "$dir/$1.sock" ] && return 0; sleep 0.05; done
	echo "daemon $1 did not start" >&2
	return 1
}

# p50/p99 of the first result of a --json run
lat() {
	/usr/bin/python3 -c 'import json,sys
r=json.load(sys.stdin)["results"][0]["lat_us"]
print("%.2f %.1f" % (r["p50"], r["p99"]))'
}

run_one() { # LABEL BIN
	local label=$1 bin=$2
	local k=$label$RANDOM
	local bench=$bench
	[ -x "$(dirname "$bin")/rdmax-bench" ] && bench=$(dirname "$bin")/rdmax-bench
	start_daemon "a$k" "$bin"
	start_daemon "b$k" "$bin"
	local -a cenv=()
	[ "$label" = old ] && read -r -a cenv <<<"${RDMAX_ABLAT_ENV_OLD:-}"
	[ "$label" = new ] && read -r -a cenv <<<"${RDMAX_ABLAT_ENV_NEW:-}"
	"$bench" serve --socket "$dir/b$k.sock" --desc "$dir/b$k.desc" --size 1M \
		--stop-file "$dir/stop$k" &
	local serve=$!
	pids+=($serve)
	for _ in $(seq 100); do [ -s "$dir/b$k.desc" ] && break; sleep 0.05; done
	local hop tcp
	hop=$(env "${cenv[@]}" "${pin_client[@]}" "$bench" local --socket "$dir/a$k.sock" --lat -s 64 -n "$iters" --json | lat)
	tcp=$(env "${cenv[@]}" "${pin_client[@]}" "$bench" run --socket "$dir/a$k.sock" --desc "$dir/b$k.desc" --lat -s 64 \
		-n "$iters" --json | lat)
	touch "$dir/stop$k"
	wait "$serve" || true
	kill "${pids[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
	pids=()
	printf '%-4s ring_hop p50/p99 us %-14s tcp_write64 p50/p99 us %-14s load %s\n' \
		"$label" "$hop" "$tcp" "$(cut -d' ' -f1 /proc/loadavg)"
}

floor() {
	[ -x "$pingpong" ] || return 0
	local cpus=()
	[ "${RDMAX_ABLAT_PIN:-0}" = 1 ] && cpus=(--cpus 0,1)
	local ring line
	ring=$("$pingpong" --ring -n "$((iters * 4))" "${cpus[@]}" --json | lat)
	line=$("$pingpong" --lines 1 -n "$((iters * 4))" "${cpus[@]}" --json | lat)
	printf '%-4s shm ring p50/p99 us %-14s shm line p50/p99 us %-14s load %s\n' \
		floor "$ring" "$line" "$(cut -d' ' -f1 /proc/loadavg)"
}

for r in $(seq "$reps"); do
	if [ $((r % 2)) = 1 ]; then
		run_one old "$old"; run_one new "$new"
	else
		run_one new "$new"; run_one old "$old"
	fi
	floor
done
