#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# qos.sh - the traffic-class part of `make bench` (docs/benchmarks.md,
# "Traffic classes"). Two rdmaxd on loopback over the TCP transport (or, in
# the Soft-RoCE guest with RDMAX_BENCH_QOS_TRANSPORT=verbs, over verbs
# between two devices: guest.sh runs it so); on
# daemon b two served regions (one per class, so the read-back checks of
# the two writers never overlap). Per repetition and per [qos] setting (off:
# today's FIFO, on: the scheduler and the latency connection; pinned, over
# TCP with two CPUs or more: on, with each daemon's loop and the latency
# client on CPU 0 and the daemons' I/O threads and the bulk client on the
# other CPUs; and the relayed raw ping-pong with its processes on CPU 0,
# idle and beside that pinned bulk load, as its reference; nodes, over TCP
# with two CPUs or more: on, with each node on CPUs of its own, as two
# machines would be: daemon a and both clients on the first half of the
# CPUs, daemon b and its serving clients on the second half, nothing
# configured in the daemons; and as its reference the relayed raw ping-pong
# laid out the same way, its timing process and relay on node a's CPUs and
# its receiver on one of node b's, idle and beside that bulk load):
#   idle   latency-class 64 KiB writes alone, one at a time (--lat): p50/p99
#   bulk   bulk-class 8 MiB writes alone, window 16: GB/s
#   mixed  the same bulk writes for SECONDS+3, and meanwhile (from 0.5 s on)
#          the latency writes: both
# and then the machine's floor under equal conditions, with no rdmax at all
# (tcp-stream, two processes per stream on loopback):
#   raw idle   a 64 KiB ping-pong with a 1-byte answer (--lat), blocking and
#              spinning (--spin, both ends poll the way rdmaxd does)
#   raw mixed  the same two ping-pongs while a raw 8 MiB stream runs between
#              two other processes (blocking, and spinning), and (after the
#              [qos] on runs) while the rdmax bulk load itself runs: the same
#              load, with a round trip that does not go through the daemons
#   raw relay  the blocking ping-pong through a relay process (tcp-stream
#              --relay: four hand-offs per round trip, as a job through two
#              daemons), idle and under the rdmax bulk load: before any latency
#              job (the copies on the daemons' loops) and, after the mixed run,
#              with the latency lane open (the copies on the I/O threads, as the
#              latency writes met them); and the same relay with its relay and
#              receiver waiting in epoll_wait() (--epoll), as an event loop such as
#              rdmaxd's waits, idle and with the lane open
# Over verbs the raw reference is perftest between the same two devices: two
# ping-pongs of 64 KiB, `ib_write_lat` (writes; its ends spin on memory) and
# `ib_send_lat -e` (sends; its ends sleep on completion events, as the
# latency client and the daemons' loops do between jobs), their typical and
# 99 % figures, alone, while `ib_write_bw -s 8M -q 2` runs between the
# devices, and under the rdmax bulk load (before any latency job, and again
# after the mixed run with the lane open). The class
# is the session's, from $RDMAX_TRAFFIC_CLASS. Results go to
# $RDMAX_BENCH_OUT (build/bench): host-qos-MODE-TEST-rREP.json (rdmax-bench
# --json; guest-qos-verbs-... over verbs), and a summary with medians and
# spreads in host-qos-summary.txt (guest-qos-verbs-summary.txt).
# Targets: p99 of mixed <= 2x p99 of idle, bulk of mixed >= 0.9x bulk alone;
# the summary also gives rdmax's degradation against the raw reference's.
#
# Environment: RDMAX_BUILD (build), RDMAX_BENCH_OUT, RDMAX_BENCH_SECONDS (2,
# per run), RDMAX_BENCH_QOS_REPS (3), RDMAX_BENCH_QOS_SET (extra --set
# options for daemon a, blank-separated, e.g. qos.max_in_flight=16),
# RDMAX_BENCH_QOS_LAT_SPIN_US (0: the latency client's RDMAX_SPIN_US),
# RDMAX_BENCH_QOS_BULK_OP (write; paged or paged_read: the bulk load as page
# lists), RDMAX_BENCH_QOS_MODES (off on [pinned]: a subset, for runs by hand),
# RDMAX_BENCH_QOS_TRANSPORT (tcp, or verbs with RDMAX_BENCH_QOS_DEVS and
# RDMAX_BENCH_QOS_ADDRS: two devices and their addresses, daemon a's first).
set -u

build=${RDMAX_BUILD:-build}
out=${RDMAX_BENCH_OUT:-$build/bench}
secs=${RDMAX_BENCH_SECONDS:-2}
reps=${RDMAX_BENCH_QOS_REPS:-3}
run=$(mktemp -d /tmp/rdmax-qos.XXXXXX) || exit 1
pids=()
failed=0

cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	pids=()
}
trap 'cleanup; rm -rf "$run"' EXIT
transport=${RDMAX_BENCH_QOS_TRANSPORT:-tcp}
case $transport in
tcp) pre=host-qos ;;
verbs)
	pre=guest-qos-verbs
	read -r dev_a dev_b <<<"${RDMAX_BENCH_QOS_DEVS:-rxe0 rxe1}"
	read -r ip_a ip_b <<<"${RDMAX_BENCH_QOS_ADDRS:-192.0.2.1 192.0.2.2}"
	;;
*)
	echo "qos: RDMAX_BENCH_QOS_TRANSPORT must be tcp or verbs" >&2
	exit 2
	;;
esac
mkdir -p "$out" || exit 1
rm -f "$out/$pre"-*
. "$(dirname "$0")/lib.sh"

verbs_daemon() { # NAME DEV IP PORT [RDMAXD-ARGS...]: an rdmaxd over verbs on DEV
	"$build/rdmaxd" --node-name "$1" --socket "$run/$1.sock" --transport verbs \
		--listen "$3" --port "$4" --log-level notice --set "verbs.devices=$2" \
		"${@:5}" 2>"$run/$1.log" &
	pids+=($!)
	wait_socket "$run/$1.sock" "${pids[-1]}" && return 0
	echo "SKIP qos: rdmaxd '$1' did not start: $(tail -n 2 "$run/$1.log" | tr '\n' ' ')"
	return 1
}

daemon() { # NAME [--set ...]: an rdmaxd over TCP on loopback, or over verbs
	local admin=(--set "daemon.admin_socket=$run/$1-admin.sock")
	case $transport:$1 in
	verbs:a) verbs_daemon a "$dev_a" "$ip_a" 17481 "${admin[@]}" "${@:2}" ;;
	verbs:b) verbs_daemon b "$dev_b" "$ip_b" 17482 "${admin[@]}" "${@:2}" ;;
	*) start_daemon "$1" qos "${admin[@]}" "${@:2}" ;;
	esac
}

serve() { # NAME SIZE: a region on daemon b
	start_serve b "$1" "$2" qos
}

# [qos] pinned: the clients run where their class's daemon threads do (taskset).
latpin=()
bulkpin=()

lat() { # FILE: latency-class 64 KiB writes, one at a time
	# Two warm-up jobs only: under a FIFO bulk load each takes as long as the queue ahead of
	# it, and a long warm-up would move the timed part past the end of the bulk run.
	RDMAX_TRAFFIC_CLASS=latency RDMAX_SPIN_US=$latspin \
		timeout 120 "${latpin[@]}" "$build/rdmax-bench" run --socket "$run/a.sock" \
		--desc "$run/lat.desc" -o write -s 64K --lat --warmup 2 -D "$secs" --json="$1" \
		>/dev/null 2>>"$run/bench.err"
}

# RDMAX_BENCH_QOS_BULK_OP: the bulk jobs' op, write (default), or paged / paged_read (8 MiB
# of 32 KiB pages each: a KV cache's pages, one segment list per MiB).
bulkop=(-o "${RDMAX_BENCH_QOS_BULK_OP:-write}")
[ "${RDMAX_BENCH_QOS_BULK_OP:-write}" != write ] && bulkop+=(--page-len 32K)

bulk() { # FILE SECONDS: bulk-class 8 MiB writes, 16 outstanding
	RDMAX_TRAFFIC_CLASS=bulk timeout 120 "${bulkpin[@]}" "$build/rdmax-bench" run \
		--socket "$run/a.sock" --desc "$run/bulk.desc" "${bulkop[@]}" -s 8M -w 16 -D "$2" --warmup 4 --json="$1" \
		>/dev/null 2>>"$run/bench.err"
}

# The latency client sleeps at once when it waits (operations.md, "Traffic classes": a
# waiter that spins on a node whose CPUs are all busy waits for a time slice, as the
# raw spinning ping-pong below shows); RDMAX_BENCH_QOS_LAT_SPIN_US sets another spin.
latspin=${RDMAX_BENCH_QOS_LAT_SPIN_US:-0}

stream=$build/tests/bench/tcp-stream
if [ "$transport" = verbs ]; then
	stream='' # tcp-stream measures TCP; perftest is the reference here
	gid_a=$(gid_index "$dev_a" "$ip_a")
	gid_b=$(gid_index "$dev_b" "$ip_b")
	if [ -z "$gid_a" ] || [ -z "$gid_b" ] || ! command -v ib_write_lat >/dev/null; then
		echo "qos: no RoCE v2 GID or no perftest: no raw reference over verbs"
		gid_a=''
	fi
fi

rawpin=() # [qos] pinned: the raw ping-pong's processes where the latency chain runs
rawlat() { # FILE [--spin] [--relay]: the raw 64 KiB ping-pong
	timeout 120 "${rawpin[@]}" "$stream" --lat -s 64K -D "$secs" --json "${@:2}" >"$1" \
		2>>"$run/bench.err"
}

# A load for both raw ping-pongs one after the other, with time to start first
# (relayloadsecs: and the relayed one after them).
loadsecs=$(awk -v s="$secs" 'BEGIN { print 2 * s + 2 }')
relayloadsecs=$(awk -v s="$secs" 'BEGIN { print 3 * s + 2 }')

rawpair() { # PID NAME REP [relay]: the raw ping-pongs while load PID runs, then wait for it
	sleep 0.5
	rawlat "$out/host-qos-raw-$2-r$3.json" || failed=1
	rawlat "$out/host-qos-raw-${2}spin-r$3.json" --spin || failed=1
	if [ "${4:-}" = relay ]; then
		rawlat "$out/host-qos-raw-${2}relay-r$3.json" --relay || failed=1
	fi
	wait "$1" || failed=1
}

relay_beside_bulk() { # BULKFILE RAWFILE [TCP-STREAM-ARGS...]: the relayed ping-pong beside the rdmax bulk load
	local b
	bulk "$1" "$(awk -v s="$secs" 'BEGIN { print s + 2 }')" &
	b=$!
	sleep 0.5
	rawlat "$2" --relay "${@:3}" || failed=1
	wait $b || failed=1
}

# Over verbs: perftest ping-pongs between the two devices (server on b's, client on a's).
vport=18620
vlatiters=${RDMAX_BENCH_QOS_PERF_ITERS:-300}
vloadsecs=$(awk -v s="$secs" 'BEGIN { print 8 * s + 10 }')
verbs_rawlat1() { # FILE LOADPID TOOL [ARGS...]: one ping-pong; it must end before LOADPID does
	local port=$vport spid rc
	vport=$((vport + 1))
	timeout 120 "$3" -d "$dev_b" -x "$gid_b" -F -s 65536 -n "$vlatiters" -p "$port" "${@:4}" \
		>"$run/perf-lat-server.log" 2>&1 &
	spid=$!
	wait_listen "$port" "$spid" || { wait "$spid"; return 1; }
	timeout 120 "$3" -d "$dev_a" -x "$gid_a" -F -s 65536 -n "$vlatiters" -p "$port" "${@:4}" \
		"$ip_b" >"$1" 2>>"$run/bench.err"
	rc=$?
	wait "$spid" || rc=1
	if [ -n "$2" ] && ! kill -0 "$2" 2>/dev/null; then
		echo "qos: ${1##*/} outlived its load (RDMAX_BENCH_QOS_PERF_ITERS fewer)" \
			>>"$run/bench.err"
		rc=1
	fi
	return $rc
}

verbs_rawlat() { # NAME REP [LOADPID]: the spinning and the sleeping ping-pong
	verbs_rawlat1 "$out/$pre-raw-$1-r$2.txt" "${3:-}" ib_write_lat &&
		verbs_rawlat1 "$out/$pre-raw-${1}ev-r$2.txt" "${3:-}" ib_send_lat -e
}

verbs_beside_bulk() { # BULKFILE NAME REP: both perftest ping-pongs beside the rdmax bulk load
	local b
	bulk "$1" "$vloadsecs" &
	b=$!
	sleep 1
	verbs_rawlat "$2" "$3" "$b" || failed=1
	wait $b || failed=1
}

verbs_rawref() { # REP: both ping-pongs alone, then under ib_write_bw 8 MiB on 2 QPs
	local port=$vport spid lpid
	vport=$((vport + 1))
	verbs_rawlat idle "$1" || failed=1
	timeout 120 ib_write_bw -d "$dev_b" -x "$gid_b" -F -s 8388608 -q 2 -D "$vloadsecs" \
		-p "$port" >"$run/perf-bw-server.log" 2>&1 &
	spid=$!
	wait_listen "$port" "$spid" || failed=1
	timeout 120 ib_write_bw -d "$dev_a" -x "$gid_a" -F -s 8388608 -q 2 -D "$vloadsecs" \
		-p "$port" "$ip_b" >"$out/$pre-raw-loadperf-r$1.txt" 2>>"$run/bench.err" &
	lpid=$!
	sleep 1
	verbs_rawlat mixedperf "$1" "$lpid" || failed=1
	wait "$lpid" || failed=1
	wait "$spid" || failed=1
}

rawref() { # REP: raw ping-pongs idle, then under a raw 8 MiB stream (blocking, spinning)
	local b load
	rawlat "$out/host-qos-raw-idle-r$1.json" || failed=1
	rawlat "$out/host-qos-raw-idlespin-r$1.json" --spin || failed=1
	rawlat "$out/host-qos-raw-idlerelay-r$1.json" --relay || failed=1
	rawlat "$out/host-qos-raw-idlerelayep-r$1.json" --relay --epoll || failed=1
	for load in block spin; do
		b=()
		[ $load = spin ] && b=(--spin)
		timeout 120 "$stream" -s 8M -D "$loadsecs" --json "${b[@]}" \
			>"$out/host-qos-raw-load$load-r$1.json" 2>>"$run/bench.err" &
		rawpair $! "mixed$load" "$1"
	done
}

if [ "$transport" = tcp ] && [ ! -x "$stream" ]; then
	echo "qos: $stream is missing (make all builds it): no raw reference"
	failed=1
fi
# [qos] pinned (TCP, two CPUs or more): [qos] on with each daemon's loop on CPU 0 and its
# I/O threads on the others (engine.loop_cpus, engine.worker_cpus), the latency client on
# CPU 0 and the bulk client on the others; docs/operations.md, "CPUs".
# Every [qos] setting but off runs both daemons with [qos] lane_linger_ms = 0: once the
# latency runs opened the lane, the bulk copies (TCP) and the bulk posts on software
# devices (verbs) stay off the loops for the raw references that follow the mixed run, as
# they were during it, though no rdmax latency job runs beside them. With the default
# linger they would go back to the loops a second later, and a reference would meet another
# load: over TCP one copying thread per daemon instead of its I/O threads, which leaves a
# round trip far more of the CPUs (docs/benchmarks.md, "The load the latency writes meet").
# Bulk alone runs before any latency job, so it moves as it does without latency traffic
# either way.
modes="off on"
ncpu=$(nproc)
if [ "$transport" = tcp ] && [ "$ncpu" -ge 2 ]; then
	modes="off on pinned nodes"
	workers=1
	[ "$ncpu" -gt 2 ] && workers=1-$((ncpu - 1))
	# [qos] nodes: node a on the first half of the CPUs, node b on the rest.
	half=$((ncpu / 2))
	node_a=0
	[ "$half" -gt 1 ] && node_a=0-$((half - 1))
	node_b=$half
	[ $((ncpu - half)) -gt 1 ] && node_b=$half-$((ncpu - 1))
fi
modes=${RDMAX_BENCH_QOS_MODES:-$modes} # a subset, for runs by hand
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for ((rep = 1; rep <= reps; rep++)); do
	if [ -x "$stream" ]; then
		rawref "$rep"
		echo "qos: rep $rep, raw reference done"
	elif [ "$transport" = verbs ] && [ -n "$gid_a" ]; then
		verbs_rawref "$rep"
		echo "qos: rep $rep, raw reference done"
	fi
	for mode in $modes; do
		enabled=false
		[ "$mode" != off ] && enabled=true
		# shellcheck disable=SC2086
		extra=$(for s in ${RDMAX_BENCH_QOS_SET:-}; do printf -- '--set %s ' "$s"; done)
		pin=()
		latpin=()
		bulkpin=()
		[ "$mode" != off ] && pin=(--set qos.lane_linger_ms=0)
		if [ "$mode" = pinned ]; then
			pin+=(--set engine.loop_cpus=0 --set "engine.worker_cpus=$workers")
			latpin=(taskset -c 0)
			bulkpin=(taskset -c "$workers")
		fi
		# shellcheck disable=SC2086
		if ! daemon a --set "qos.enabled=$enabled" "${pin[@]}" $extra ||
			! daemon b "${pin[@]}" ||
			! serve bulk 128M || ! serve lat 1M; then
			failed=1
			cleanup
			break 2
		fi
		if [ "$mode" = nodes ]; then
			# Every thread of each daemon (those started later inherit it) and
			# each serving client on its node's CPUs; the clients below on a's.
			taskset -a -p -c "$node_a" "${pids[0]}" >/dev/null &&
				taskset -a -p -c "$node_b" "${pids[1]}" >/dev/null &&
				taskset -a -p -c "$node_b" "${pids[2]}" >/dev/null &&
				taskset -a -p -c "$node_b" "${pids[3]}" >/dev/null || failed=1
			latpin=(taskset -c "$node_a")
			bulkpin=(taskset -c "$node_a")
		fi
		p=$out/$pre-$mode
		# Bulk alone and the unpinned raw references beside the rdmax bulk load come
		# before any latency-class job: the latency lane that job opens keeps bulk copies (TCP) and
		# bulk posts on software devices (verbs) off the loop for [qos] lane_linger_ms
		# after its last byte, so bulk alone is measured as it runs without latency
		# traffic.
		bulk "$p-bulk-r$rep.json" "$secs" || failed=1
		if [ "$mode" = on ] && [ -x "$stream" ]; then
			# The same rdmax bulk load, and the raw ping-pongs between two other
			# processes meanwhile: what this load leaves a round trip that does
			# not go through the daemons.
			bulk "$p-rawbulk-r$rep.json" "$relayloadsecs" &
			rawpair $! mixedrdmax "$rep" relay
		elif [ "$mode" = on ] && [ "$transport" = verbs ] && [ -n "$gid_a" ]; then
			verbs_beside_bulk "$p-rawbulk-r$rep.json" mixedrdmax "$rep"
		fi
		lat "$p-idle-r$rep.json" || failed=1
		# Bulk starts first and runs past the latency writes (their warm-up, and a last
		# job that may wait a whole queue): the timed latency jobs all meet the load.
		bulk "$p-mixedbulk-r$rep.json" "$(awk -v s="$secs" 'BEGIN { print s + 3 }')" &
		bpid=$!
		sleep 0.5
		lat "$p-mixedlat-r$rep.json" || failed=1
		wait $bpid || failed=1
		if [ "$mode" = on ] && [ -x "$stream" ]; then
			# The relayed ping-pong beside the same bulk load as the latency writes
			# met it: the lane open, the copies on the I/O threads.
			relay_beside_bulk "$p-rawbulkio-r$rep.json" "$out/host-qos-raw-mixedrdmaxiorelay-r$rep.json"
			# And the relay that waits as an event loop must, on many sockets at once.
			relay_beside_bulk "$p-rawbulkioep-r$rep.json" \
				"$out/host-qos-raw-mixedrdmaxiorelayep-r$rep.json" --epoll
		elif [ "$mode" = on ] && [ "$transport" = verbs ] && [ -n "$gid_a" ]; then
			# The same over verbs: the lane open, the bulk posts on the posting thread.
			verbs_beside_bulk "$p-rawbulkio-r$rep.json" mixedrdmaxio "$rep"
		fi
		if [ "$mode" = nodes ]; then
			# The reference laid out as the nodes are: the timing process and
			# the relay on node a's CPUs, the receiver on node b's first.
			rawpin=(taskset -c "$node_a")
			rawlat "$out/host-qos-raw-idlenodesrelay-r$rep.json" --relay --recv-cpu "$half" ||
				failed=1
			relay_beside_bulk "$p-rawbulk-r$rep.json" \
				"$out/host-qos-raw-mixednodesrelay-r$rep.json" --recv-cpu "$half"
			rawpin=()
		fi
		if [ "$mode" = pinned ]; then
			# The reference under equal conditions: the relayed ping-pong's three
			# processes on CPU 0 with the latency chain, idle and beside the
			# pinned bulk load, its copies on the I/O threads as in the mixed run.
			rawpin=(taskset -c 0)
			rawlat "$out/host-qos-raw-idlepinnedrelay-r$rep.json" --relay || failed=1
			relay_beside_bulk "$p-rawbulk-r$rep.json" "$out/host-qos-raw-mixedpinnedrelay-r$rep.json"
			rawpin=()
		fi
		cleanup
		echo "qos: rep $rep, [qos] $mode done"
	done
done
((failed)) && echo "qos: a run failed: $(tail -n 3 "$run/bench.err" | tr '\n' ' ')"

load1=$(cut -d' ' -f1-3 /proc/loadavg)
where="TCP on loopback"
[ "$transport" = verbs ] && where="verbs between $dev_a and $dev_b"
/usr/bin/python3 "$(dirname "$0")/qos_summary.py" "$out" "$reps" "$load0" "$load1" "$latspin" "$pre" \
	"$where" |
	tee "$out/$pre-summary.txt"
exit $failed
