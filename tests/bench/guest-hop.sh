#!/bin/bash
# SPDX-License-Identifier: MIT
# Inside a Soft-RoCE guest: what one process hop costs there, apart from the
# emulated NIC. Per round, in rotating order: shm-pingpong (two processes
# through shared memory, spinning with a pause or a sched_yield() per poll:
# the floor of any daemon design) and `rdmax-bench local --lat -s 64` (client
# -> rdmaxd -> client through the ring, the daemon copying 64 B itself, no
# NIC work) for each client wait in RDMAX_HOP_VARIANTS (LABEL[:NAME=VALUE,...],
# as ab-guest.sh's RDMAX_AB_VARIANTS), against a verbs daemon (its passes
# poll rxe0's CQ) and a TCP one.
#
#   tests/vm/run-in-guest --two-nodes -- tests/bench/guest-hop.sh
#
# RDMAX_BUILD (build), RDMAX_HOP_ROUNDS (3), RDMAX_HOP_ITERS (2000),
# RDMAX_HOP_DAEMONS ("verbs tcp": which of the two daemons to use),
# RDMAX_HOP_WRITES=1 (also, in the same rotation: tests/bench/verbs-hop, a
# raw 64 B write from rxe0 to rxe1 with one in flight, posted by the timing
# process itself (`direct`) or by a second process it asks through shared
# memory (`hop`, pause or yield), its post call's mean, p50 and p90 beside it, and
# rdmax-bench's completed 64 B write between two verbs daemons, with the
# client's mean against the daemon's own (rdmaxd_job_duration_seconds): the
# NIC work with and without a process hop),
# RDMAX_HOP_CODE (with RDMAX_HOP_WRITES=1; e.g. "256 512"): also the direct raw
# write with verbs-hop --code N, N calls of scattered code before each post
# (the code a daemon runs per job, without a daemon),
# RDMAX_HOP_CODE_HOP (likewise): the raw write through the process hop, the
# asker waiting as librdmax does (--hop --yield --pause-ns 4000), with N calls
# of code before each post: a daemon design's floor with N calls of code per job;
# N:F spreads the calls over F functions (--code-span F), N+M adds M calls in the
# asker before each request (--asker-code M), e.g. "0+64 64+64 256:4096+64",
# RDMAX_HOP_VARIANTS=none: no ring-hop runs (`rdmax-bench local`),
# RDMAX_BENCH_OUT (build/bench-hop): one line per run in hop.txt there;
# RDMAX_BENCH_PERF=1 keeps whole-guest profiles of the last round.
set -uo pipefail

build=${RDMAX_BUILD:-build}
rounds=${RDMAX_HOP_ROUNDS:-3}
iters=${RDMAX_HOP_ITERS:-2000}
out=${RDMAX_BENCH_OUT:-build/bench-hop}
variants=${RDMAX_HOP_VARIANTS:-yield pause:RDMAX_SPIN_YIELD=0}
run=$(mktemp -d /tmp/rdmax-hop.XXXXXX) || exit 1
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	rm -rf "$run"
}
trap cleanup EXIT
mkdir -p "$out"
# wait_line (its start_daemon is replaced by this file's own below).
. "$(dirname "$0")/lib.sh"

start_daemon() { # NAME ARGS...
	local name=$1 i
	shift
	"$build/rdmaxd" --node-name "$name" --socket "$run/$name.sock" --log-level notice \
		--set "daemon.admin_socket=$run/$name-admin.sock" "$@" 2>"$run/$name.log" &
	pids+=($!)
	for ((i = 0; i < 100; i++)); do
		[ -S "$run/$name.sock" ] && return 0
		sleep 0.05
	done
	echo "guest-hop: rdmaxd $name did not start: $(tail -n 2 "$run/$name.log")" >&2
	exit 1
}

profile=0
measure() { # NAME COMMAND...: one line into hop.txt
	local name=$1 line
	shift
	if [ "$profile" = 1 ]; then
		# Around the command rather than of it: it may be a shell function.
		perf record -q -a -e cpu-clock -F 997 -o "$run/perf.data" 2>/dev/null &
		local perf_pid=$!
		"$@" >"$run/out" 2>&1
		kill -TERM "$perf_pid" # a background job ignores SIGINT
		wait "$perf_pid"
		{
			perf report -i "$run/perf.data" --stdio --sort comm 2>/dev/null | grep -v '^#' |
				head -n 12
			perf report -i "$run/perf.data" --stdio --sort comm,sym 2>/dev/null |
				grep -v '^#' | head -n 40
			echo "rdmaxd alone:"
			perf report -i "$run/perf.data" --stdio --comms rdmaxd --sort sym 2>/dev/null |
				grep -v '^#' | head -n 40
		} >"$out/perf-$name.txt"
	else
		"$@" >"$run/out" 2>&1
	fi
	if [[ $1 == *shm-pingpong ]] || [ "$1" = verbs_hop ]; then
		line=$(tail -n 1 "$run/out")
	else
		line=$(/usr/bin/python3 -c 'import json,sys
r=json.load(open(sys.argv[1]))["results"][0]["lat_us"]
print("p50 %.1f us p99 %.1f us mean %.1f us" % (r["p50"], r["p99"], r["mean"]))' "$run/hop.json" 2>/dev/null ||
			tail -n 2 "$run/out" | tr '\n' ' ')
	fi
	echo "round $r $name: $line (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/hop.txt"
}

echo "clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)," \
	"$(nproc) CPUs" | tee "$out/hop.txt"
read -r -a daemons <<<"${RDMAX_HOP_DAEMONS:-verbs tcp}"
for d in "${daemons[@]}"; do
	case $d in
	verbs)
		start_daemon verbs --transport verbs --listen "${RDMAX_GUEST_IP0:-192.0.2.1}" \
			--port 17481 --set "verbs.devices=${RDMAX_GUEST_DEV0:-rxe0}"
		;;
	tcp) start_daemon tcp --transport tcp --listen 127.0.0.1 --port 17482 ;;
	*)
		echo "guest-hop: RDMAX_HOP_DAEMONS: unknown '$d'" >&2
		exit 1
		;;
	esac
done

ip0=${RDMAX_GUEST_IP0:-192.0.2.1}
ip1=${RDMAX_GUEST_IP1:-192.0.2.2}
writes=${RDMAX_HOP_WRITES:-0}
vport=18690
if [ "$writes" = 1 ]; then
	start_daemon peer --transport verbs --listen "$ip1" --port 17483 \
		--set "verbs.devices=${RDMAX_GUEST_DEV1:-rxe1}"
	"$build/rdmax-bench" serve --socket "$run/peer.sock" --desc "$run/peer.desc" --size 1M \
		2>"$run/serve.log" &
	pids+=($!)
	for ((i = 0; i < 100; i++)); do
		[ -e "$run/peer.desc" ] && break
		sleep 0.05
	done
fi

# The verbs daemon's write jobs so far: seconds from taking each to its completion, summed,
# and how many (rdmaxd_job_duration_seconds).
write_time() {
	"$build/rdmaxctl" --socket "$run/verbs-admin.sock" stats --prometheus 2>/dev/null |
		awk '/^rdmaxd_job_duration_seconds_(sum|count)\{op="write"\}/ { printf "%s ", $2 }'
}

# write_split SUM0 COUNT0 SUM1 COUNT1: the client's mean against the daemon's own over the run.
write_split() {
	/usr/bin/python3 - "$@" "$run/hop.json" "$r" <<'PY' | tee -a "$out/hop.txt"
import json, sys
s0, c0, s1, c1 = (float(x or 0) for x in sys.argv[1:5])
r = json.load(open(sys.argv[5]))["results"][0]["lat_us"]
own = (s1 - s0) / (c1 - c0) * 1e6 if c1 > c0 else float("nan")
print("round %s rdmax-write split: client mean %.1f us, the daemon's own mean %.1f us "
      "(entry taken to completion), outside the daemon %.1f us"
      % (sys.argv[6], r["mean"], own, r["mean"] - own))
PY
}

# verbs-hop MODE...: one raw run against a fresh server on ip1.
verbs_hop() {
	local spid
	timeout 60 "$build/tests/bench/verbs-hop" -l "$ip1" -p "$vport" >"$run/vhop-s.out" &
	spid=$!
	wait_line "$run/vhop-s.out" "$spid" listening # rdma_listen leaves no socket to see
	timeout 60 "$build/tests/bench/verbs-hop" -b "$ip0" "$ip1" -p "$vport" -n "$iters" "$@"
	wait "$spid"
	vport=$((vport + 1))
}

read -r -a vs <<<"$variants"
jobs=("shm-pause" "shm-yield")
if [ "$writes" = 1 ]; then
	jobs+=("raw-direct" "raw-hop-pause" "raw-hop-yield" "rdmax-write")
	for n in ${RDMAX_HOP_CODE:-}; do
		jobs+=("raw-direct-code-$n")
	done
	for n in ${RDMAX_HOP_CODE_HOP:-}; do
		jobs+=("raw-hop-code-$n")
	done
fi
[ "$variants" = none ] && vs=()
for v in "${vs[@]}"; do
	for d in "${daemons[@]}"; do
		jobs+=("$d/$v")
	done
done
for r in $(seq "$rounds"); do
	[ "$r" = "$rounds" ] && profile=${RDMAX_BENCH_PERF:-0}
	for ((i = 0; i < ${#jobs[@]}; i++)); do
		j=${jobs[$(((i + r - 1) % ${#jobs[@]}))]}
		case $j in
		shm-pause) measure "$j" "$build/tests/bench/shm-pingpong" --lines 1 -n "$iters" ;;
		shm-yield) measure "$j" "$build/tests/bench/shm-pingpong" --lines 1 -n "$iters" --yield ;;
		raw-direct) measure "$j" verbs_hop ;;
		raw-direct-code-*) measure "$j" verbs_hop --code "${j#raw-direct-code-}" ;;
		raw-hop-code-*)
			n=${j#raw-hop-code-}
			more=()
			if [ "$n" != "${n%+*}" ]; then
				more+=(--asker-code "${n#*+}")
				n=${n%+*}
			fi
			[ "$n" != "${n%:*}" ] && more+=(--code-span "${n#*:}")
			measure "$j" verbs_hop --hop --yield --pause-ns 4000 --code "${n%:*}" "${more[@]}"
			;;
		raw-hop-pause) measure "$j" verbs_hop --hop ;;
		raw-hop-yield) measure "$j" verbs_hop --hop --yield ;;
		rdmax-write)
			rm -f "$run/hop.json"
			read -r s0 c0 <<<"$(write_time)"
			measure "$j" "$build/rdmax-bench" run --socket "$run/verbs.sock" \
				--desc "$run/peer.desc" --lat -o write -s 64 -n "$iters" --json="$run/hop.json"
			read -r s1 c1 <<<"$(write_time)"
			write_split "$s0" "$c0" "$s1" "$c1"
			;;
		*)
			d=${j%%/*}
			v=${j#*/}
			label=${v%%:*}
			env=()
			[ "$v" != "$label" ] && IFS=, read -r -a env <<<"${v#*:}"
			sock=$run/$d.sock
			rm -f "$run/hop.json"
			measure "$d-$label" env "${env[@]}" "$build/rdmax-bench" local --socket "$sock" \
				--lat -s 64 -n "$iters" --json="$run/hop.json"
			;;
		esac
	done
done
