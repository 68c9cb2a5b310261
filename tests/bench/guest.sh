#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# guest.sh - the Soft-RoCE half of `make bench`, run by tests/bench/run.sh in
# ONE two-node guest boot (tests/vm/run-in-guest --two-nodes). Per test and
# size it alternates perftest (the reference: ib_write_bw, ib_read_bw,
# ib_write_lat, server on DEV1, client on DEV0 -> IP1) and rdmax-bench
# between two rdmaxd (--transport verbs, one per device and address), so
# drift of the emulated machine hits both the same way.
#
# Writes into $RDMAX_BENCH_OUT (inside the repository, which the guest shares):
#   guest-ref-TEST-SIZE-rREP.txt     perftest client output (parsed by report.py)
#   guest-rdmax-TEST-SIZE-rREP.json  rdmax-bench --json
#   guest-ref@ucx-TEST-SIZE-rREP.txt ucx_perftest (ucp_put_bw, ucp_put_lat) between the
#                                    same devices, UCX_TLS=rc_verbs,ud_verbs (one QP)
#   guest-ref@hop-TEST-SIZE-rREP.txt tests/bench/verbs-hop --hop (write_rtt): the same
#                                    raw write posted by a second process that the
#                                    timing one asks through shared memory, waiting as
#                                    librdmax does (pause 4 µs, then sched_yield()):
#                                    rdmaxd's process layout without its code
#   guest-ref@code-TEST-SIZE-rREP.txt tests/bench/verbs-hop --code 256 (write_rtt): the
#                                    same raw write, posted directly after about as many
#                                    instructions of unrelated code as rdmaxd runs per job
#                                    (what the emulator charges for them, without a daemon)
#   guest-ref@floor-TEST-SIZE-rREP.txt tests/bench/verbs-hop --hop ... --code 256
#                                    --code-span 4096 --asker-code 64 (write_rtt): both, a
#                                    daemon design's floor with rdmax's amount of code: the
#                                    process hop, the poster's code spread over as much text
#                                    as a program's, the asker running a client's share
#   guest-stages-write_rtt-64-rREP.json  the rdmax run's jobs on daemon a, by stage
#                                    ([metrics] job_stages, on in every daemon here):
#                                    mean µs from acceptance to the post (queue), in the
#                                    ibv_post_send() call (post: rxe's whole round trip),
#                                    from its return to the completion (complete)
# The *_1qp rows run a second pair of rdmaxd with verbs.qps_per_peer=1, so
# rdmax and UCX (one QP per endpoint) are compared at equal QP counts.
#   guest-skip.txt                   why the rdmax side could not run (exit 77)
# Exit: 0 done (a failed single run is logged and left out), 77 skipped, 1 error.
# Never uses 124 or 125, which belong to run-in-guest.
#
# Environment: RDMAX_BUILD (build), RDMAX_BENCH_OUT (build/bench),
# RDMAX_BENCH_REPS (2), RDMAX_BENCH_QPS (2), RDMAX_BENCH_GUEST_TRANSPORT (verbs; tcp exercises this
# script while the verbs transport is missing: its numbers are not the
# verbs ratios), RDMAX_BENCH_ONLY (run only the plan rows named here, as
# TEST or TEST:SIZE separated by spaces or commas, e.g. "write_bw:1048576
# read_bw"), RDMAX_BENCH_DAEMON_SET (extra `--set section.key=value`
# options for both rdmaxd, separated by spaces, for A/B runs),
# RDMAX_BENCH_BW_OPTS (rdmax-bench options of bandwidth runs, default
# "-w 64 -b 16"), RDMAX_BENCH_CPUSTAT=1 (log per run the machine's CPU
# time from /proc/stat: user, system, softirq, idle, in clock ticks; and
# the counters of both devices that moved, from their hw_counters, and
# both daemons' CPU ticks and sleeps), RDMAX_BENCH_PERF=1 (profile the
# whole guest with `perf record -a -e cpu-clock` during each run, which needs
# no PMU, and keep `perf report` by command and by symbol as
# guest-perf-WHO-TEST-SIZE-rREP.txt), RDMAX_BENCH_REF_SPINNER=1 (a shell
# loop keeps a second CPU busy while the perftest client runs: the raw
# reference with a spinning process beside it, as an rdmax job has its
# client). Works on a host with real NICs too,
# given the RDMAX_GUEST_*
# variables (see tests/vm/README.md).
set -u

build=${RDMAX_BUILD:-build}
out=${RDMAX_BENCH_OUT:-$build/bench}
reps=${RDMAX_BENCH_REPS:-2}
transport=${RDMAX_BENCH_GUEST_TRANSPORT:-verbs}
dev0=${RDMAX_GUEST_DEV0:-rxe0}
dev1=${RDMAX_GUEST_DEV1:-rxe1}
ip0=${RDMAX_GUEST_IP0:-192.0.2.1}
ip1=${RDMAX_GUEST_IP1:-192.0.2.2}
# Unix sockets cannot live on the 9p share: keep them in guest RAM.
run=$(mktemp -d /tmp/rdmax-bench.XXXXXX) || exit 1
perf_port=18600
pids=()

# Bounded work per run: the guest is emulated (about 1 Gb/s, tens of µs).
# TEST SIZE ITERS REFERENCES [REPS] (perftest; ucx: ucx_perftest put; hop: verbs-hop
# --hop; code: verbs-hop --code). The rows of the ratio line come first: a run
# cut short by its time limit keeps them. The completed small write (lat_rtt, ucx_lat) runs twice the
# repetitions: one run of it and of its references moves by half under TCG.
plan=(
	"write_bw 1048576 150 perftest"
	"write_bw 65536 1000 perftest"
	"write_bw 64 10000 perftest"
	"read_bw 1048576 100 perftest"
	"write_rtt 64 2000 perftest,ucx,hop,code,floor $((reps * 2))"
	"write_1qp 1048576 150 ucx"
	"kv 16384 4000 perftest"
	"write_lat 64 2000 perftest"
	"read_bw 65536 1000 perftest"
	"paged_bw 1048576 100 perftest"
	"write_1qp 65536 1000 ucx"
	"kv 131072 500 perftest"
)
ucx_env=(UCX_TLS=rc_verbs,ud_verbs UCX_UD_ETH_DGID_CHECK=n)
page_len=16384
# rdmax-bench settings for bandwidth runs: a deep window and batched submits,
# as perftest keeps 128 WRs posted.
read -r -a bw_opts <<<"${RDMAX_BENCH_BW_OPTS:--w 64 -b 16}"
only=${RDMAX_BENCH_ONLY:-}
only=${only//,/ }
read -r -a daemon_set <<<"${RDMAX_BENCH_DAEMON_SET:-}"
# QPs per peer on both sides: rxe works each QP serially, so under emulation
# the QP count alone changes bandwidth; perftest's bandwidth runs get the same
# number (-q) as rdmaxd (verbs.qps_per_peer).
qps=${RDMAX_BENCH_QPS:-2}

log() { echo "guest: $*"; }

# profiled NAME COMMAND...: run COMMAND, under a system-wide perf record when
# RDMAX_BENCH_PERF=1, and leave the report in $out/guest-perf-NAME.txt.
profiled() {
	local name=$1 rc
	shift
	if [ "${RDMAX_BENCH_PERF:-0}" != 1 ]; then
		"$@"
		return
	fi
	perf record -q -a -e cpu-clock -F 997 -o "$run/perf.data" -- "$@"
	rc=$?
	{
		perf report -i "$run/perf.data" --stdio --sort comm 2>/dev/null | grep -v '^#' | head -n 12
		perf report -i "$run/perf.data" --stdio --sort comm,sym 2>/dev/null | grep -v '^#' |
			head -n 40
	} >"$out/guest-perf-$name.txt"
	rm -f "$run/perf.data"
	return "$rc"
}

# The machine's CPU time so far: user system softirq idle (clock ticks, all CPUs).
cpu_ticks() {
	awk '/^cpu / { print $2 + $3, $4, $8, $5 + $6; exit }' /proc/stat
}

# Every hw counter of both devices as DEV.NAME=VALUE, one line.
dev_counters() {
	local d f
	for d in "$dev0" "$dev1"; do
		for f in "/sys/class/infiniband/$d/ports/1/hw_counters/"*; do
			[ -r "$f" ] && printf '%s.%s=%s ' "$d" "${f##*/}" "$(cat "$f")"
		done
	done
}

# CPU ticks (user + system) and voluntary context switches (sleeps) of both
# daemons, as counters of the same form.
daemon_counters() {
	local n=0 p
	for p in "${pids[@]}"; do
		n=$((n + 1))
		[ -r "/proc/$p/stat" ] || continue
		printf 'rdmaxd%s.cpu_ticks=%s ' "$n" "$(awk '{ print $14 + $15 }' "/proc/$p/stat")"
		printf 'rdmaxd%s.sleeps=%s ' "$n" \
			"$(awk '/^voluntary_ctxt_switches/ { print $2 }' "/proc/$p/status")"
	done
}

# Where packets can be lost on the way: the CPUs' input backlogs (softnet_stat,
# second column: dropped), the veth pair, UDP (rxe's tunnel).
net_counters() {
	local d=0 f n
	while read -r _ f _; do
		d=$((d + 16#$f))
	done </proc/net/softnet_stat
	printf 'softnet.dropped=%s ' "$d"
	for n in ${RDMAX_GUEST_NETDEV0:-} ${RDMAX_GUEST_NETDEV1:-}; do
		for f in rx_dropped tx_dropped; do
			printf '%s.%s=%s ' "$n" "$f" "$(cat "/sys/class/net/$n/statistics/$f" 2>/dev/null)"
		done
	done
	awk '/^Udp: [0-9]/ { printf "udp.InErrors=%s udp.RcvbufErrors=%s ", $4, $6 }' /proc/net/snmp
}

stats_now() { echo "$(cpu_ticks) $(dev_counters) $(daemon_counters) $(net_counters)"; }

stats_since() { # output of stats_now: CPU ticks since, and the counters that moved
	local -a a b
	local kv name moved=''
	local -A before
	read -r -a a <<<"$1"
	read -r -a b <<<"$(stats_now)"
	for kv in "${a[@]:4}"; do
		before[${kv%%=*}]=${kv#*=}
	done
	for kv in "${b[@]:4}"; do
		name=${kv%%=*}
		[ "${kv#*=}" != "${before[$name]:-0}" ] &&
			moved+=" $name+$((${kv#*=} - ${before[$name]:-0}))"
	done
	echo "cpu ticks: user $((b[0] - a[0])) system $((b[1] - a[1])) softirq $((b[2] - a[2]))" \
		"idle $((b[3] - a[3])); counters:${moved:- none}"
}

skip() {
	echo "$*" >"$out/guest-skip.txt"

	cleanup
	exit 77
}

cleanup() {
	local sp
	for sp in "${serve_pid:-}" "${serve1_pid:-}"; do
		[ -n "$sp" ] || continue
		kill -TERM "$sp" 2>/dev/null
		wait "$sp" 2>/dev/null
	done
	serve_pid=
	serve1_pid=
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null
	done
	for p in "${pids[@]}"; do
		wait "$p" 2>/dev/null
	done
	pids=()
	for f in a b c d serve serve1; do
		[ -e "$run/$f.log" ] && cp "$run/$f.log" "$out/guest-daemon-$f.log"
	done
	rm -rf "$run"
}
trap cleanup EXIT
# wait_listen, wait_line, gid_index (its start_daemon is replaced by this file's own below).
. "$(dirname "$0")/lib.sh"

start_daemon() { # NAME DEV IP PORT [QPS]
	local name=$1 dev=$2 ip=$3 port=$4 i
	local -a args=(--node-name "$name" --socket "$run/$name.sock" --transport "$transport"
		--listen "$ip" --port "$port" --log-level notice
		--set "daemon.admin_socket=$run/$name-admin.sock" --set metrics.job_stages=true)
	[ "$transport" = verbs ] && args+=(--set "verbs.devices=$dev" --set "verbs.qps_per_peer=${5:-$qps}")
	for i in "${daemon_set[@]}"; do
		args+=(--set "$i")
	done
	"$build/rdmaxd" "${args[@]}" 2>"$run/$name.log" &
	pids+=($!)
	wait_socket "$run/$name.sock" "${pids[-1]}" && return 0
	skip "rdmaxd --transport $transport --listen $ip did not start:" \
		"$(grep -v '^$' "$run/$name.log" | tail -n 2 | tr '\n' ' ')"
}

# The figure perftest printed: BW average (bw tests) or t_typical (lat), or
# nothing when its clock calibration failed under emulation (0, inf, nan).
perftest_value() { # FILE
	awk '/#bytes/ { getline; v = ($0 ~ /inf|nan/) ? 0 : (NF >= 9 ? $5 : $4) + 0;
		if (v > 0) print v; exit }' "$1"
}

# perftest TEST SIZE ITERS REP: server on dev1, client on dev0 -> ip1, bound by device
# and GID (without -R, so the traffic crosses the veth pair). A run whose clock
# calibration failed is repeated, twice at most.
perftest() {
	local _
	for _ in 1 2 3; do
		perftest_once "$@" || return 1
		[ -n "$(perftest_value "$out/guest-ref-$1-$2-r$4.txt")" ] && return 0
		log "perftest printed no usable figure (clock calibration under emulation); again"
	done
	mv "$out/guest-ref-$1-$2-r$4.txt" "$out/guest-ref-$1-$2-r$4.failed"
	return 1
}

perftest_once() {
	local test=$1 size=$2 iters=$3 rep=$4 prog spid rc src
	local file="$out/guest-ref-$test-$size-r$rep.txt"
	local -a common
	prog=ib_${test}
	[ "$test" = kv ] && prog=ib_write_bw # the same bytes in block-sized writes
	if [ "$test" = paged_bw ]; then
		# A paged write is many page-sized RDMA writes: perftest with that message size.
		prog=ib_write_bw
		iters=$((iters * size / page_len))
		size=$page_len
	fi
	common=(-F -s "$size" -n "$iters" -p "$perf_port")
	if [ "$test" = write_rtt ]; then
		# One write in flight, each waited for: the time of a write with its
		# completion (the ACK's round trip), which is what an rdmax job's
		# latency is; ib_write_lat reports half a ping-pong instead.
		prog=ib_write_bw
		common+=(-t 1 --report_gbits -q 1)
	elif [ "$test" != write_lat ]; then
		common+=(--report_gbits -q "$qps")
	fi
	[ -n "$gid0" ] || return 1
	timeout 60 "$prog" -d "$dev1" -x "$gid1" "${common[@]}" >"$run/perf-server.log" 2>&1 &
	spid=$!
	wait_listen "$perf_port" "$spid"
	local c0 spinner=''
	if [ "${RDMAX_BENCH_REF_SPINNER:-0}" = 1 ]; then
		# A second process that keeps a CPU busy, as rdmax's waiting client does.
		timeout 120 bash -c 'while :; do :; done' &
		spinner=$!
	fi
	c0=$(stats_now)
	profiled "ref-$test-$size-r$rep" timeout 60 "$prog" -d "$dev0" -x "$gid0" "${common[@]}" \
		"$ip1" >"$file.tmp" 2>&1
	rc=$?
	if [ -n "$spinner" ]; then
		kill "$spinner" 2>/dev/null
		wait "$spinner" 2>/dev/null
	fi
	wait "$spid"
	src=$?
	[ "${RDMAX_BENCH_CPUSTAT:-0}" = 1 ] && log "$prog $size B: $(stats_since "$c0")"
	perf_port=$((perf_port + 1))
	if [ "$rc" != 0 ] || [ "$src" != 0 ]; then
		log "$prog $size B: client exit $rc, server exit $src (left out)"
		mv "$file.tmp" "$out/guest-ref-$test-$size-r$rep.failed"
		return 1
	fi
	mv "$file.tmp" "$file"
	log "$prog $size B x $iters: $(grep -A1 '#bytes' "$file" | tail -n 1 | tr -s ' \t' ' ')"
}

# ucx_perftest between the two devices: put bandwidth (one QP) or put latency.
ucx() { # TEST SIZE ITERS REP
	local test=$1 size=$2 iters=$3 rep=$4 ut=ucp_put_bw spid rc src
	local file="$out/guest-ref@ucx-$test-$size-r$rep.txt"
	[ "$test" = write_rtt ] && ut=ucp_put_lat
	if ! command -v ucx_perftest >/dev/null; then
		log "ucx_perftest is not installed (ucx-utils): UCX rows left out"
		return 1
	fi
	env "${ucx_env[@]}" UCX_NET_DEVICES="$dev1:1" /usr/bin/time -f 'cpu_s %U %S' \
		-o "$run/ucx-s.time" timeout 60 ucx_perftest -p "$perf_port" >"$run/ucx-server.log" 2>&1 &
	spid=$!
	wait_listen "$perf_port" "$spid"
	env "${ucx_env[@]}" UCX_NET_DEVICES="$dev0:1" /usr/bin/time -f 'cpu_s %U %S' \
		-o "$run/ucx-c.time" timeout 60 ucx_perftest "$ip1" -p "$perf_port" -t "$ut" \
		-s "$size" -n "$iters" >"$file.tmp" 2>&1
	rc=$?
	wait "$spid"
	src=$?
	perf_port=$((perf_port + 1))
	cat "$run/ucx-s.time" "$run/ucx-c.time" >>"$file.tmp" 2>/dev/null
	if [ "$rc" != 0 ] || [ "$src" != 0 ] || ! grep -q '^Final:' "$file.tmp"; then
		log "ucx_perftest $ut $size B: client exit $rc, server exit $src (left out):" \
			"$(grep -v '^$' "$file.tmp" | tail -n 2 | tr '\n' ' ')"
		mv "$file.tmp" "$out/guest-ref@ucx-$test-$size-r$rep.failed"
		return 1
	fi
	mv "$file.tmp" "$file"
	log "ucx_perftest $ut $size B x $iters: $(grep '^Final:' "$file" | tr -s ' ' ' ')"
}

# verbs-hop between the two devices: the raw write through a process hop (hop), posted
# directly after 256 calls of scattered code, about 5 600 instructions (code), or through
# the hop with that code spread wide and 64 calls in the asker (floor).
hop() { # TEST SIZE ITERS REP [code|floor]
	local test=$1 size=$2 iters=$3 rep=$4 tool=${5:-hop} spid rc src
	local file="$out/guest-ref@$tool-$test-$size-r$rep.txt" args=(--hop --yield --pause-ns 4000)
	[ "$tool" = code ] && args=(--code 256)
	[ "$tool" = floor ] && args+=(--code 256 --code-span 4096 --asker-code 64)
	timeout 60 "$build/tests/bench/verbs-hop" -l "$ip1" -p "$perf_port" >"$run/hop-s.out" \
		2>&1 &
	spid=$!
	wait_line "$run/hop-s.out" "$spid" listening
	timeout 60 "$build/tests/bench/verbs-hop" -b "$ip0" "$ip1" -p "$perf_port" -n "$iters" \
		-s "$size" "${args[@]}" >"$file.tmp" 2>&1
	rc=$?
	wait "$spid"
	src=$?
	perf_port=$((perf_port + 1))
	if [ "$rc" != 0 ] || [ "$src" != 0 ] || ! grep -q '^verbs-hop ' "$file.tmp"; then
		log "verbs-hop ${args[*]} $size B: client exit $rc, server exit $src (left out):" \
			"$(tail -n 2 "$file.tmp" "$run/hop-s.out" | tr '\n' ' ')"
		mv "$file.tmp" "$out/guest-ref@$tool-$test-$size-r$rep.failed"
		return 1
	fi
	mv "$file.tmp" "$file"
	log "$(cat "$file")"
}

refs() { # REFERENCES TEST SIZE ITERS REP
	local tool
	for tool in ${1//,/ }; do
		case $tool in
		perftest) perftest "$2" "$3" "$4" "$5" ;;
		ucx) ucx "$2" "$3" "$4" "$5" ;;
		hop) hop "$2" "$3" "$4" "$5" ;;
		code) hop "$2" "$3" "$4" "$5" code ;;
		floor) hop "$2" "$3" "$4" "$5" floor ;;
		esac
	done
}

tx_bytes() { cat "/sys/class/net/$1/statistics/tx_bytes" 2>/dev/null || echo 0; }

rdmax() { # TEST SIZE ITERS REP
	local test=$1 size=$2 iters=$3 rep=$4 rc netdev='' before=0 sent
	local file="$out/guest-rdmax-$test-$size-r$rep.json"
	local a=a b=b ia=0 ib=1
	if [[ $test == *_1qp ]]; then
		a=c b=d ia=2 ib=3
	fi
	local -a args=(run --socket "$run/$a.sock" --desc "$run/$b.desc" -s "$size" -n "$iters"
		--daemon-pid "${pids[$ia]}" --peer-daemon-pid "${pids[$ib]}"
		--label "guest $transport $test" --json="$file.tmp")
	case $test in
	write_bw | write_1qp) args+=(-o write "${bw_opts[@]}") ;;
	read_bw) args+=(-o read "${bw_opts[@]}") ;;
	write_lat | write_rtt) args+=(-o write --lat) ;;
	paged_bw) args+=(-o paged --page-len "$page_len" "${bw_opts[@]}") ;;
	kv) # 2 prefill clients -> 1 decode client; requests of 2 MiB or 4 MiB
		args=(kv --socket "$run/a.sock" --decode-socket "$run/b.sock" --clients 2
			--block-len "$size" -D 3 --daemon-pid "${pids[0]}" --peer-daemon-pid "${pids[1]}"
			--label "guest $transport $test" --json="$file.tmp")
		if [ "$size" -ge 131072 ]; then args+=(--layers 4 --blocks 8); else args+=(--layers 8 --blocks 16); fi
		;;
	esac
	# In the guest, the payload must cross the veth pair (writes leave through
	# NETDEV0, read data through NETDEV1), not loop inside one device.
	if [ "${RDMAX_GUEST:-}" = 1 ] && [ "$transport" = verbs ]; then
		netdev=${RDMAX_GUEST_NETDEV0:-}
		[ "$test" = read_bw ] && netdev=${RDMAX_GUEST_NETDEV1:-}
		[ "$test" = kv ] && netdev='' # timed, not counted: the decode side checks every byte
		[ -n "$netdev" ] && before=$(tx_bytes "$netdev")
	fi
	local c0 stages0=''
	c0=$(stats_now)
	[ "$test" = write_rtt ] && stages0=$(stage_sums "$run/$a-admin.sock")
	profiled "rdmax-$test-$size-r$rep" timeout 120 "$build/rdmax-bench" "${args[@]}" \
		>"$run/bench.out" 2>&1
	rc=$?
	if [ "$rc" = 0 ] && [ -n "$stages0" ]; then
		stage_means "$stages0" "$(stage_sums "$run/$a-admin.sock")" \
			"$out/guest-stages-$test-$size-r$rep.json" &&
			log "rdmax $test $size B, daemon a per stage (µs, means): $(cat \
				"$out/guest-stages-$test-$size-r$rep.json")"
	fi
	[ "${RDMAX_BENCH_CPUSTAT:-0}" = 1 ] && log "rdmax $test $size B: $(stats_since "$c0")"
	if [ "$rc" = 0 ] && [ -n "$netdev" ]; then
		sent=$(($(tx_bytes "$netdev") - before))
		if [ "$sent" -lt $((size * iters)) ]; then
			log "rdmax $test $size B: only $sent bytes left through $netdev (left out: the" \
				"transfer did not cross the veth pair)"
			rm -f "$file.tmp"
			return 1
		fi
	fi
	if [ "$rc" != 0 ]; then
		log "rdmax-bench $test $size B: exit $rc (left out): $(tail -n 3 "$run/bench.out" | tr '\n' ' ')"
		rm -f "$file.tmp"
		return 1
	fi
	mv "$file.tmp" "$file"
	if [ "$test" = kv ]; then
		log "rdmax kv $size B blocks: $(grep -o '"Gbps": [0-9.]*' "$file" | head -n 1), verify" \
			"$(grep -o '"verify": "[a-zA-Z]*"' "$file")"
	else
		log "rdmax $test $size B x $iters: $(tail -n 1 "$run/bench.out" | tr -s ' ' ' ')"
	fi
}

mkdir -p "$out" || exit 1
gid0=$(gid_index "$dev0" "$ip0")
gid1=$(gid_index "$dev1" "$ip1")
log "$dev0 ($ip0, GID index ${gid0:-?}) and $dev1 ($ip1, GID index ${gid1:-?}), transport $transport, $reps reps"
[ -n "$only" ] && log "only: $only"
[ "${#daemon_set[@]}" -gt 0 ] && log "rdmaxd --set: ${daemon_set[*]}"
if [ -z "$gid0" ] || [ -z "$gid1" ]; then
	log "no RoCE v2 GID found: perftest runs are left out"
fi

start_daemon a "$dev0" "$ip0" 17471
start_daemon b "$dev1" "$ip1" 17472
serve_pid=
"$build/rdmax-bench" serve --socket "$run/b.sock" --desc "$run/b.desc" --size 1M \
	2>"$run/serve.log" &
serve_pid=$!
for ((i = 0; i < 100; i++)); do
	[ -e "$run/b.desc" ] && break
	kill -0 "$serve_pid" 2>/dev/null || break
	sleep 0.05
done
[ -e "$run/b.desc" ] || skip "rdmax-bench serve did not publish a descriptor: $(tail -n 1 "$run/serve.log")"

# A second pair with one QP per peer for the *_1qp rows (UCX uses one QP per endpoint).
serve1_pid=
start_1qp() {
	start_daemon c "$dev0" "$ip0" 17473 1
	start_daemon d "$dev1" "$ip1" 17474 1
	"$build/rdmax-bench" serve --socket "$run/d.sock" --desc "$run/d.desc" --size 1M \
		2>"$run/serve1.log" &
	serve1_pid=$!
	for ((i = 0; i < 100; i++)); do
		[ -e "$run/d.desc" ] && return 0
		kill -0 "$serve1_pid" 2>/dev/null || break
		sleep 0.05
	done
	log "the one-QP pair did not publish a descriptor: $(tail -n 1 "$run/serve1.log")"
}

# RDMAX_BENCH_ONLY: is the plan row TEST SIZE selected?
selected() {
	local w
	[ -z "$only" ] && return 0
	for w in $only; do
		[ "$w" = "$1" ] || [ "$w" = "$1:$2" ] && return 0
	done
	return 1
}

for item in "${plan[@]}"; do
	read -r test size iters tools row_reps <<<"$item"
	selected "$test" "$size" || continue
	if [[ $test == *_1qp ]] && [ -z "$serve1_pid" ]; then
		start_1qp
	fi
	for ((rep = 1; rep <= ${row_reps:-$reps}; rep++)); do
		# Alternate which side goes first, so drift within a pair cancels over reps.
		if ((rep % 2)); then
			refs "$tools" "$test" "$size" "$iters" "$rep"
			rdmax "$test" "$size" "$iters" "$rep"
		else
			rdmax "$test" "$size" "$iters" "$rep"
			refs "$tools" "$test" "$size" "$iters" "$rep"
		fi
	done
done
cleanup
trap - EXIT
exit 0
