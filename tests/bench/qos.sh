#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# qos.sh - the traffic-class part of `make bench` (docs/benchmarks.md,
# "Traffic classes"). Two rdmaxd on loopback over the TCP transport; on
# daemon b two served regions (one per class, so the read-back checks of
# the two writers never overlap). Per repetition and per [qos] setting (off:
# today's FIFO, on: the scheduler and the latency connection):
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
#              daemons), idle and under the rdmax bulk load
# The class is the session's, from $RDMAX_TRAFFIC_CLASS. Results go to
# $RDMAX_BENCH_OUT (build/bench): host-qos-MODE-TEST-rREP.json (rdmax-bench
# --json), and a summary with medians and spreads in host-qos-summary.txt.
# Targets: p99 of mixed <= 2x p99 of idle, bulk of mixed >= 0.9x bulk alone;
# the summary also gives rdmax's degradation against the raw reference's.
#
# Environment: RDMAX_BUILD (build), RDMAX_BENCH_OUT, RDMAX_BENCH_SECONDS (2,
# per run), RDMAX_BENCH_QOS_REPS (3), RDMAX_BENCH_QOS_SET (extra --set
# options for daemon a, blank-separated, e.g. qos.max_in_flight=16),
# RDMAX_BENCH_QOS_LAT_SPIN_US (0: the latency client's RDMAX_SPIN_US).
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
mkdir -p "$out" || exit 1
rm -f "$out"/host-qos-*
. "$(dirname "$0")/lib.sh"

daemon() { # NAME [--set ...]: an rdmaxd over TCP on loopback
	start_daemon "$1" qos --set "daemon.admin_socket=$run/$1-admin.sock" "${@:2}"
}

serve() { # NAME SIZE: a region on daemon b
	start_serve b "$1" "$2" qos
}

lat() { # FILE: latency-class 64 KiB writes, one at a time
	# Two warm-up jobs only: under a FIFO bulk load each takes as long as the queue ahead of
	# it, and a long warm-up would move the timed part past the end of the bulk run.
	RDMAX_TRAFFIC_CLASS=latency RDMAX_SPIN_US=$latspin \
		timeout 120 "$build/rdmax-bench" run --socket "$run/a.sock" \
		--desc "$run/lat.desc" -o write -s 64K --lat --warmup 2 -D "$secs" --json="$1" \
		>/dev/null 2>>"$run/bench.err"
}

bulk() { # FILE SECONDS: bulk-class 8 MiB writes, 16 outstanding
	RDMAX_TRAFFIC_CLASS=bulk timeout 120 "$build/rdmax-bench" run --socket "$run/a.sock" \
		--desc "$run/bulk.desc" -o write -s 8M -w 16 -D "$2" --warmup 4 --json="$1" \
		>/dev/null 2>>"$run/bench.err"
}

# The latency client sleeps at once when it waits (operations.md, "Traffic classes": a
# waiter that spins on a node whose CPUs are all busy waits for a time slice, as the
# raw spinning ping-pong below shows); RDMAX_BENCH_QOS_LAT_SPIN_US sets another spin.
latspin=${RDMAX_BENCH_QOS_LAT_SPIN_US:-0}

stream=$build/tests/bench/tcp-stream

rawlat() { # FILE [--spin] [--relay]: the raw 64 KiB ping-pong
	timeout 120 "$stream" --lat -s 64K -D "$secs" --json "${@:2}" >"$1" 2>>"$run/bench.err"
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

rawref() { # REP: raw ping-pongs idle, then under a raw 8 MiB stream (blocking, spinning)
	local b load
	rawlat "$out/host-qos-raw-idle-r$1.json" || failed=1
	rawlat "$out/host-qos-raw-idlespin-r$1.json" --spin || failed=1
	rawlat "$out/host-qos-raw-idlerelay-r$1.json" --relay || failed=1
	for load in block spin; do
		b=()
		[ $load = spin ] && b=(--spin)
		timeout 120 "$stream" -s 8M -D "$loadsecs" --json "${b[@]}" \
			>"$out/host-qos-raw-load$load-r$1.json" 2>>"$run/bench.err" &
		rawpair $! "mixed$load" "$1"
	done
}

if [ ! -x "$stream" ]; then
	echo "qos: $stream is missing (make all builds it): no raw reference"
	failed=1
fi
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for ((rep = 1; rep <= reps; rep++)); do
	if [ -x "$stream" ]; then
		rawref "$rep"
		echo "qos: rep $rep, raw reference done"
	fi
	for mode in off on; do
		enabled=false
		[ $mode = on ] && enabled=true
		# shellcheck disable=SC2086
		extra=$(for s in ${RDMAX_BENCH_QOS_SET:-}; do printf -- '--set %s ' "$s"; done)
		# shellcheck disable=SC2086
		if ! daemon a --set "qos.enabled=$enabled" $extra || ! daemon b ||
			! serve bulk 128M || ! serve lat 1M; then
			failed=1
			cleanup
			break 2
		fi
		p=$out/host-qos-$mode
		lat "$p-idle-r$rep.json" || failed=1
		bulk "$p-bulk-r$rep.json" "$secs" || failed=1
		# Bulk starts first and runs past the latency writes (their warm-up, and a last
		# job that may wait a whole queue): the timed latency jobs all meet the load.
		bulk "$p-mixedbulk-r$rep.json" "$(awk -v s="$secs" 'BEGIN { print s + 3 }')" &
		bpid=$!
		sleep 0.5
		lat "$p-mixedlat-r$rep.json" || failed=1
		wait $bpid || failed=1
		if [ $mode = on ] && [ -x "$stream" ]; then
			# The same rdmax bulk load, and the raw ping-pongs between two other
			# processes meanwhile: what this load leaves a round trip that does
			# not go through the daemons.
			bulk "$p-rawbulk-r$rep.json" "$relayloadsecs" &
			rawpair $! mixedrdmax "$rep" relay
		fi
		cleanup
		echo "qos: rep $rep, [qos] $mode done"
	done
done
((failed)) && echo "qos: a run failed: $(tail -n 3 "$run/bench.err" | tr '\n' ' ')"

load1=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$out" "$reps" "$load0" "$load1" "$latspin" <<'PY' | tee "$out/host-qos-summary.txt"
import json, statistics, sys, glob
out, reps = sys.argv[1], int(sys.argv[2])
def vals(mode, test, key):
    v = []
    for f in sorted(glob.glob("%s/host-qos-%s-%s-r*.json" % (out, mode, test))):
        r = json.load(open(f))["results"][0]
        v.append(r["lat_us"][key] if key != "GBps" else r["GBps"])
    return v
def fmt(v, unit):
    if not v:
        return "n/a"
    return "%.1f %s (%s)" % (statistics.median(v), unit, ", ".join("%.1f" % x for x in v))
print("traffic classes, TCP on loopback, %d repetitions (median, then each run); "
      "load average %s before, %s after; latency client RDMAX_SPIN_US=%s"
      % (reps, sys.argv[3], sys.argv[4], sys.argv[5]))
for mode in ("off", "on"):
    idle50, idle99 = vals(mode, "idle", "p50"), vals(mode, "idle", "p99")
    mix50, mix99 = vals(mode, "mixedlat", "p50"), vals(mode, "mixedlat", "p99")
    bulk = [x * 1000 for x in vals(mode, "bulk", "GBps")]
    mixb = [x * 1000 for x in vals(mode, "mixedbulk", "GBps")]
    print("[qos] %s" % mode)
    print("  latency 64K idle      p50 %s   p99 %s" % (fmt(idle50, "us"), fmt(idle99, "us")))
    print("  latency 64K + bulk    p50 %s   p99 %s" % (fmt(mix50, "us"), fmt(mix99, "us")))
    print("  bulk 8M alone         %s" % fmt(bulk, "MB/s"))
    print("  bulk 8M + latency     %s" % fmt(mixb, "MB/s"))
    if idle99 and mix99 and bulk and mixb:
        r99 = statistics.median(mix99) / statistics.median(idle99)
        rb = statistics.median(mixb) / statistics.median(bulk)
        print("  p99 under load / idle p99 = %.2f (target <= 2)   bulk with / without "
              "latency = %.2f (target >= 0.9)" % (r99, rb))
# The machine's floor: the same ratios for a raw TCP ping-pong under a raw stream.
def ratio(num, den):
    return statistics.median(num) / statistics.median(den) if num and den else None
print("raw reference (tcp-stream): 64K ping-pong; load: a raw 8M stream between two other "
      "processes, or rdmax's 8M bulk writes")
LOADS = {"block": "blocking", "spin": "spinning", "rdmax": "rdmax"}
raw = {}
for lat, tag in (("blocking", ""), ("spinning", "spin"), ("relayed", "relay")):
    idle50, idle99 = vals("raw", "idle" + tag, "p50"), vals("raw", "idle" + tag, "p99")
    print("  %-8s ping-pong idle              p50 %s   p99 %s" %
          (lat, fmt(idle50, "us"), fmt(idle99, "us")))
    for load in ("block", "spin", "rdmax"):
        m50 = vals("raw", "mixed" + load + tag, "p50")
        m99 = vals("raw", "mixed" + load + tag, "p99")
        if tag == "relay" and load != "rdmax":
            continue  # the relayed ping-pong runs under the rdmax load only
        print("  %-8s ping-pong + %-8s %s p50 %s   p99 %s" %
              (lat, LOADS[load], "bulk  " if load == "rdmax" else "stream", fmt(m50, "us"),
               fmt(m99, "us")))
        raw[(tag, load)] = (ratio(m50, idle50), ratio(m99, idle99))
for load in ("block", "spin"):
    print("  %s stream alone        %s" % ("blocking" if load == "block" else "spinning",
          fmt([x * 1000 for x in vals("raw", "load" + load, "GBps")], "MB/s")))
print("  rdmax bulk 8M with the raw ping-pongs %s" %
      fmt([x * 1000 for x in vals("on", "rawbulk", "GBps")], "MB/s"))
on = (ratio(vals("on", "mixedlat", "p50"), vals("on", "idle", "p50")),
      ratio(vals("on", "mixedlat", "p99"), vals("on", "idle", "p99")))
if on[1] is not None:
    print("degradation under load (median under load / median idle), [qos] on: "
          "p50 %.1fx, p99 %.1fx" % on)
    for (tag, load), (r50, r99) in sorted(raw.items()):
        if r99 is None:
            continue
        print("  raw %-8s ping-pong, %-8s load: p50 %.1fx, p99 %.1fx; rdmax / raw: "
              "p50 %.2f, p99 %.2f" % ({"": "blocking", "spin": "spinning", "relay": "relayed"}[tag], LOADS[load], r50,
                                       r99, on[0] / r50, on[1] / r99))
PY
exit $failed
