#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# qos-trace.sh - where a latency-class round trip waits under bulk load
# (docs/benchmarks.md, "Where the latency round trip waits under bulk").
# The mixed part of qos.sh once, [qos] on: two rdmaxd over TCP on loopback,
# bulk-class 8 MiB writes (window 16) and, meanwhile, latency-class 64 KiB
# writes one at a time; the kernel's scheduler events (sched_switch,
# sched_wakeup) of the whole machine and the system calls of the two
# daemons' loop threads are recorded through tracefs while the latency
# writes run, then tests/bench/sched_trace.py prints:
#   - per thread: run-queue waits (woken or preempted until on a CPU) and
#     the lengths of its runs;
#   - per loop thread and socket: the time of each sendmsg()/recvmsg();
#   - the latency writes' round trips, and in the slow ones the share spent
#     waiting for a CPU by the client and by each daemon's loop;
#   - what ran while a loop waited, on its CPU and on the other ones.
# Diagnostic only, not part of `make bench`: it needs root and tracefs
# (/sys/kernel/tracing), and tracing costs time of its own.
#
# Environment: RDMAX_BUILD (build), RDMAX_BENCH_SECONDS (2: the latency
# run), RDMAX_TRACE_OUT (build/bench/qos-trace.txt: the raw trace), and
# RDMAX_BENCH_QOS_SET (extra --set options for both daemons).
set -u

build=${RDMAX_BUILD:-build}
secs=${RDMAX_BENCH_SECONDS:-2}
trace_out=${RDMAX_TRACE_OUT:-$build/bench/qos-trace.txt}
tracefs=/sys/kernel/tracing
here=$(cd "$(dirname "$0")" && pwd)

if [ ! -w "$tracefs/trace" ] && ! mount -t tracefs nodev "$tracefs" 2>/dev/null; then
	echo "qos-trace: $tracefs is not writable (root and tracefs are needed)" >&2
	exit 2
fi
if [ ! -d "$tracefs/events/sched/sched_switch" ] || [ ! -d "$tracefs/events/raw_syscalls" ]; then
	echo "qos-trace: this kernel has no sched_switch or raw_syscalls trace events" >&2
	exit 2
fi

run=$(mktemp -d /tmp/rdmax-qos-trace.XXXXXX) || exit 1
pids=()
tracing_off() {
	echo 0 >"$tracefs/tracing_on"
	echo 0 >"$tracefs/events/sched/sched_switch/enable"
	echo 0 >"$tracefs/events/sched/sched_wakeup/enable"
	echo 0 >"$tracefs/events/raw_syscalls/enable"
	echo 0 >"$tracefs/events/raw_syscalls/filter"
}
cleanup() {
	tracing_off 2>/dev/null
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
}
trap 'cleanup; rm -rf "$run"' EXIT
mkdir -p "$(dirname "$trace_out")" || exit 1

. "$here/lib.sh"
daemon() { # NAME [--set ...]
	# shellcheck disable=SC2086
	start_daemon "$1" qos-trace --set "daemon.admin_socket=$run/$1-admin.sock" \
		${RDMAX_BENCH_QOS_SET:-} "${@:2}" >&2
}

daemon a --set qos.enabled=true || exit 1
daemon b || exit 1
loop_a=${pids[0]}
loop_b=${pids[1]}
start_serve b lat 1M qos-trace >&2 || exit 1
start_serve b bulk 128M qos-trace >&2 || exit 1

RDMAX_TRAFFIC_CLASS=bulk timeout 120 "$build/rdmax-bench" run --socket "$run/a.sock" \
	--desc "$run/bulk.desc" -o write -s 8M -w 16 -D $((secs + 4)) --warmup 4 \
	--json="$run/bulk.json" >/dev/null 2>"$run/bulk.err" &
bulk=$!
pids+=("$bulk")
# The latency connection opens with the first latency job: its warm-up jobs come first.
sleep 1

echo 20000 >"$tracefs/buffer_size_kb"
echo >"$tracefs/trace"
echo "common_pid == $loop_a || common_pid == $loop_b" >"$tracefs/events/raw_syscalls/filter"
echo 1 >"$tracefs/events/sched/sched_switch/enable"
echo 1 >"$tracefs/events/sched/sched_wakeup/enable"
echo 1 >"$tracefs/events/raw_syscalls/enable"
RDMAX_TRAFFIC_CLASS=latency RDMAX_SPIN_US=0 "$build/rdmax-bench" run \
	--socket "$run/a.sock" --desc "$run/lat.desc" -o write -s 64K --lat --warmup 50 \
	-D "$secs" --json="$run/lat.json" >/dev/null 2>"$run/lat.err" &
lat=$! # the client itself (no timeout wrapper): its thread is the one traced
pids+=("$lat")
echo 1 >"$tracefs/tracing_on"
wait $lat
lat_rc=$?
tracing_off
cp "$tracefs/trace" "$trace_out"
echo >"$tracefs/trace"
threads() { # PID: its thread ids, blank-separated
	local t out=()
	for t in /proc/"$1"/task/*; do out+=("${t##*/}"); done
	echo "${out[*]}"
}
io_a=$(threads "$loop_a")
io_b=$(threads "$loop_b")
wait $bulk
bulk_rc=$?
if [ $lat_rc -ne 0 ] || [ $bulk_rc -ne 0 ]; then
	echo "qos-trace: a load failed (latency $lat_rc, bulk $bulk_rc)" >&2
	cat "$run/lat.err" "$run/bulk.err" >&2
	exit 1
fi
echo "threads: client $lat, daemon a $io_a (loop $loop_a), daemon b $io_b (loop $loop_b)"
/usr/bin/python3 "$here/sched_trace.py" "$trace_out" --client "$lat" \
	--loop "a=$loop_a" --loop "b=$loop_b" --threads "a=${io_a// /,}" --threads "b=${io_b// /,}" \
	--bench "$run/lat.json" --bench "$run/bulk.json"
