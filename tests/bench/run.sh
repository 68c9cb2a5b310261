#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# run.sh - `make bench`: rdmax against its references, as ratios.
#   (a) guest: one two-node Soft-RoCE boot (tests/bench/guest.sh): perftest
#       against rdmax-bench between two rdmaxd over the verbs transport;
#   (b) host: two rdmaxd on loopback over the TCP transport against raw TCP
#       streams that sleep or poll (tests/bench/tcp-stream, --spin, --batch),
#       iperf3 and UCX over TCP (ucx_perftest), and same-node copies (two
#       clients of one daemon) against memcpy;
#       and the cost of TLS: rdmaxd with tcp_encryption = on against the
#       same daemons' plain TCP, alternating (tcp_tls rows);
#   (c) scaling (tests/bench/scaling.sh): 1, 2, 4, 8 client processes on one
#       daemon, bandwidth, job rate and the daemon's RSS.
#   (d) traffic classes (tests/bench/qos.sh): p99 of latency-class 64 KiB
#       writes idle and under a saturating bulk load, and the bulk bandwidth,
#       with [qos] off, on, on with the loops on a CPU of their own
#       (pinned), and on with each node on CPUs of its own (nodes), against
#       raw TCP 64 KiB ping-pongs (direct and relayed, laid out as rdmax's
#       chain) idle and under load, the relayed one also beside the bulk load as
#       the latency writes meet it (summary in host-qos-summary.txt);
#   (e) the same over verbs, in a second two-node Soft-RoCE boot (qos.sh
#       with RDMAX_BENCH_QOS_TRANSPORT=verbs), against perftest's
#       ib_write_lat and ib_send_lat -e idle and under ib_write_bw
#       (guest-qos-verbs-summary.txt).
# Reference and rdmax alternate per size. Then tests/bench/report.py prints
# one table of ratios and the `ratios:` line; raw results stay in
# $RDMAX_BUILD/bench (*.json, perftest *.txt, summary.json).
#
# Environment: RDMAX_BUILD (build), RDMAX_BENCH_OUT ($RDMAX_BUILD/bench),
# RDMAX_BENCH_REPS (2), RDMAX_BENCH_QPS (2), RDMAX_BENCH_SECONDS (1, per host run),
# RDMAX_BENCH_SKIP_GUEST=1, RDMAX_BENCH_GUEST_TRANSPORT (verbs),
# RDMAX_BENCH_GUEST_TIMEOUT (600); RDMAX_BENCH_ONLY, RDMAX_BENCH_DAEMON_SET,
# RDMAX_BENCH_BW_OPTS, RDMAX_BENCH_CPUSTAT and RDMAX_BENCH_PERF go to the
# guest part (see tests/bench/guest.sh); part (e) runs unless
# RDMAX_BENCH_SKIP_GUEST=1 or RDMAX_BENCH_ONLY names rows without qos_verbs,
# with RDMAX_BENCH_QOS_VERBS_REPS (2), RDMAX_BENCH_QOS_VERBS_SECONDS (2) and
# RDMAX_BENCH_QOS_VERBS_TIMEOUT (480, the boot's limit in seconds);
# RDMAX_BENCH_TCP_CC (cubic; system: the machine's) for the host parts' TCP streams.
# A part that cannot run says `SKIP <part>: <reason>` and its ratios are n/a;
# the exit status is 0 unless the host part itself failed.
set -u

build=${RDMAX_BUILD:-build}
out=${RDMAX_BENCH_OUT:-$build/bench}
reps=${RDMAX_BENCH_REPS:-2}
secs=${RDMAX_BENCH_SECONDS:-1}
guest_timeout=${RDMAX_BENCH_GUEST_TIMEOUT:-600}
host_failed=0
pids=()
serve_pid=

mkdir -p "$out" || exit 1
# Only this script's own results: a stale file would enter the medians.
rm -f "$out"/guest-* "$out"/host-* "$out"/summary.json

# The TCP congestion control of every stream on the host (rdmax, tcp-stream, iperf3, UCX):
# the machine's default, which the bench sets to the kernel's own, cubic, for the host parts
# unless RDMAX_BENCH_TCP_CC names another ("system" leaves the machine's). BBR, which some
# images make the default, paces each stream by its model of a network path; on loopback
# it throttled every stream 2-3 x and unevenly (iperf3 39 Gb/s under bbr, 76-85 under
# cubic): docs/benchmarks.md, "Congestion control on loopback". Restored on exit.
cc_file=/proc/sys/net/ipv4/tcp_congestion_control
cc_was=$(cat "$cc_file" 2>/dev/null)
cc_want=${RDMAX_BENCH_TCP_CC:-cubic}
[ "$cc_want" = system ] && cc_want=$cc_was
cc_set() { # NAME
	[ "$(cat "$cc_file" 2>/dev/null)" = "$1" ] || echo "$1" 2>/dev/null >"$cc_file"
}
cc_restore() {
	[ -n "$cc_was" ] && cc_set "$cc_was"
}

# Ratios are only as good as the machine is quiet: say how busy it was, and what
# waking a process costs here (two processes on one CPU bouncing a byte over pipes:
# two process switches and four system calls), which every KV request pays a few times.
machine() {
	local wake
	wake=$("$build/tests/bench/shm-pingpong" --pipe --cpus 0,0 -n 20000 2>/dev/null |
		sed -n 's/.*round trip p50 \([0-9.]*\) us.*/\1/p')
	echo "== machine: $(nproc) CPUs, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)," \
		"TCP congestion control now $(cat "$cc_file" 2>/dev/null || echo unknown) (the host rows set their own)," \
		"process wake-up round trip ${wake:-n/a} us (pipe, one CPU)" |
		tee -a "$out/host-machine.txt"
}
machine

# The guest writes only into this directory (its 9p share, tests/vm/run-in-guest); what it
# writes anywhere else stays in its own memory and is gone with it, so an output directory
# outside the repository would leave every guest ratio n/a without a word.
out_abs=$(realpath -m "$out")
here=$(pwd -P)
guest_out_why=''
case $out_abs/ in
"$here"/*) ;;
*) guest_out_why="RDMAX_BENCH_OUT ($out_abs) is outside $here, the only place the guest writes to" ;;
esac

# ---- (a) guest: Soft-RoCE, perftest vs rdmax over verbs ----
echo "== guest part: Soft-RoCE two nodes (rxe0 -> rxe1), perftest vs rdmax-bench"
t0=$(date +%s)
if [ "${RDMAX_BENCH_SKIP_GUEST:-0}" = 1 ]; then
	echo "SKIP guest part: RDMAX_BENCH_SKIP_GUEST=1"
	echo "RDMAX_BENCH_SKIP_GUEST=1" >"$out/guest-skip.txt"
elif [ -n "$guest_out_why" ]; then
	echo "SKIP guest part: $guest_out_why"
	echo "$guest_out_why" >"$out/guest-skip.txt"
elif [ ! -x tests/vm/run-in-guest ]; then
	echo "SKIP guest part: tests/vm/run-in-guest is missing"
	echo "tests/vm/run-in-guest is missing" >"$out/guest-skip.txt"
else
	tests/vm/run-in-guest --two-nodes --timeout "$guest_timeout" \
		-e RDMAX_BUILD="$build" -e RDMAX_BENCH_OUT="$out" -e RDMAX_BENCH_REPS="$reps" \
		-e RDMAX_BENCH_GUEST_TRANSPORT="${RDMAX_BENCH_GUEST_TRANSPORT:-verbs}" \
		-e RDMAX_BENCH_QPS="${RDMAX_BENCH_QPS:-2}" \
		-e RDMAX_BENCH_ONLY="${RDMAX_BENCH_ONLY:-}" \
		-e RDMAX_BENCH_DAEMON_SET="${RDMAX_BENCH_DAEMON_SET:-}" \
		-e RDMAX_BENCH_BW_OPTS="${RDMAX_BENCH_BW_OPTS:-}" \
		-e RDMAX_BENCH_CPUSTAT="${RDMAX_BENCH_CPUSTAT:-0}" -e RDMAX_BENCH_PERF="${RDMAX_BENCH_PERF:-0}" \
		-- tests/bench/guest.sh 2>"$out/guest.stderr"
	rc=$?
	case $rc in
	0) ;;
	77) echo "SKIP guest part: $(cat "$out/guest-skip.txt")" ;;
	125)
		why=$(grep -m1 -o 'cannot start guest: .*' "$out/guest.stderr")
		echo "SKIP guest part: ${why:-cannot start guest (see $out/guest.stderr)}"
		echo "${why:-cannot start guest}" >"$out/guest-skip.txt"
		;;
	124)
		echo "SKIP guest part: timed out after ${guest_timeout}s (finished runs are kept)"
		;;
	*)
		echo "SKIP guest part: guest.sh failed with exit $rc; tail of $out/guest.stderr:"
		tail -n 5 "$out/guest.stderr" | sed 's/^/    /'
		echo "guest.sh failed with exit $rc" >"$out/guest-skip.txt"
		;;
	esac
fi
echo "== guest part took $(($(date +%s) - t0)) s"

# ---- (b) host: TCP transport vs raw TCP; same-node vs memcpy ----
echo "== host part: two rdmaxd over TCP on loopback vs raw TCP, iperf3, UCX; same-node vs memcpy"
t0=$(date +%s)
run=$(mktemp -d /tmp/rdmax-bench.XXXXXX) || exit 1
if [ -n "$cc_want" ] && ! cc_set "$cc_want"; then
	echo "host: cannot set TCP congestion control $cc_want (not root?): the TCP rows run under $cc_was"
fi
cc_now=$(cat "$cc_file" 2>/dev/null || echo unknown)
echo "host: TCP congestion control $cc_now (the machine's: ${cc_was:-unknown})"
echo "$cc_now" >"$out/host-tcp-cc.txt"

cleanup() {
	if [ -n "$serve_pid" ]; then
		kill -TERM "$serve_pid" 2>/dev/null
		wait "$serve_pid" 2>/dev/null
		serve_pid=
	fi
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	pids=()
	for f in a b serve ta tb tserve; do
		[ -e "$run/$f.log" ] && cp "$run/$f.log" "$out/host-daemon-$f.log"
	done
	rm -rf "$run"
}
trap 'cleanup; cc_restore' EXIT

. "$(dirname "$0")/lib.sh"

# Ports for the reference tools' own servers (UCX, iperf3), one per run.
ref_port=18700

# References, by tool (the part after @ in the file name; tcp-stream has none):
#   tcp-stream  one TCP stream, blocking write()/recv(MSG_WAITALL) (sleeps in the kernel)
#   spin        tcp-stream --spin: both ends poll non-blocking sockets, as rdmaxd does
#   spinbatch   tcp-stream --spin --batch 16: and 16 messages per sendmsg()
#   span        tcp-stream --span 32M: blocking, through as much memory as the KV rows move
#               (their prefill sources and decode pool, 32 MiB each) instead of one hot buffer
#   spinspan    tcp-stream --spin --span 32M
#   relay       rdmax-bench kv --relay: the KV row's clients, unchanged, over two raw relay
#               processes (one TCP connection, a gathered sendmsg() and a scattered
#               recvmsg() per request) where the daemons stand: the row's process layout
#               without rdmaxd's code
#   iperf3      iperf3 -l SIZE, one stream (sleeps in the kernel, like a user's iperf3)
#   ucxtag      ucx_perftest -t tag_bw / tag_lat, UCX_TLS=tcp on lo (one connection)
#   ucxput      ucx_perftest -t ucp_put_bw / ucp_put_lat, UCX_TLS=tcp on lo
# Every reference uses one connection, as rdmaxd uses one per peer pair.
ref() { # TOOL TEST SIZE REP
	local tool=$1 test=$2 size=$3 rep=$4 file spid rc=0 port=$((ref_port++))
	local lat=0
	[ "$test" = tcp_lat ] && lat=1
	file="$out/host-ref@$tool-$test-$size-r$rep"
	[ "$tool" = tcp-stream ] && file="$out/host-ref-$test-$size-r$rep"
	case $tool in
	tcp-stream | spin | spinbatch | span | spinspan)
		local -a args=(-s "$size" --json --label "host $test $tool")
		if ((lat)); then args+=(--lat -n 5000); else args+=(-D "$secs"); fi
		[[ $tool == spin* ]] && args+=(--spin)
		[ "$tool" = spinbatch ] && args+=(--batch 16)
		[[ $tool == *span ]] && args=(-s 1M "${args[@]:2}" --span 32M) # the KV rows' bytes
		timeout 60 "$build/tests/bench/tcp-stream" "${args[@]}" >"$file.json.tmp" 2>"$run/ref.err" ||
			rc=$?
		file=$file.json
		;;
	iperf3)
		timeout 60 iperf3 -s -1 -p "$port" >"$run/iperf3-s.log" 2>&1 &
		spid=$!
		wait_listen "$port" "$spid" || rc=1
		# Paged and KV rows (and 8 MiB) move the same bytes as iperf3 in 1 MiB writes.
		local len=$size
		if [ "$test" = tcp_kv ] || [[ $test == tcp_paged* ]] || ((size > 1048576)); then
			len=1048576 # also the most iperf3 takes per write
		fi
		((rc)) || timeout 60 iperf3 -c 127.0.0.1 -p "$port" -l "$len" -t "$iperf_secs" \
			--json >"$file.json.tmp" 2>"$run/ref.err" || rc=$?
		((rc)) && kill "$spid" 2>/dev/null
		wait "$spid" || ((rc)) || rc=1
		file=$file.json
		;;
	relay)
		local -a kv
		kv_args "$size" kv
		timeout 120 "$build/rdmax-bench" kv --relay "${kv[@]}" --label "host $test relay" \
			--json="$file.json.tmp" >"$run/ref.err" 2>&1 || rc=$?
		file=$file.json
		;;
	ucxtag | ucxput)
		local ut iters
		case $tool$lat in
		ucxtag0) ut=tag_bw ;;
		ucxtag1) ut=tag_lat ;;
		ucxput0) ut=ucp_put_bw ;;
		ucxput1) ut=ucp_put_lat ;;
		esac
		iters=$(((2 << 30) / size))
		((iters > 20000)) && iters=20000
		((lat)) && iters=5000
		UCX_TLS=tcp UCX_NET_DEVICES=lo /usr/bin/time -f 'cpu_s %U %S' -o "$run/ucx-s.time" \
			timeout 60 ucx_perftest -p "$port" >"$run/ucx-s.log" 2>&1 &
		spid=$!
		wait_listen "$port" "$spid" || rc=1
		((rc)) || UCX_TLS=tcp UCX_NET_DEVICES=lo /usr/bin/time -f 'cpu_s %U %S' \
			-o "$run/ucx-c.time" timeout 60 ucx_perftest 127.0.0.1 -p "$port" -t "$ut" \
			-s "$size" -n "$iters" >"$file.txt.tmp" 2>"$run/ref.err" || rc=$?
		((rc)) && kill "$spid" 2>/dev/null
		wait "$spid" || ((rc)) || rc=1
		cat "$run/ucx-s.time" "$run/ucx-c.time" >>"$file.txt.tmp" 2>/dev/null
		file=$file.txt
		;;
	esac
	if ((rc)); then
		echo "host: $tool $test $size B failed (left out): $(tail -n 2 "$run/ref.err" | tr '\n' ' ')"
		rm -f "$file.tmp"
		return 1
	fi
	mv "$file.tmp" "$file"
}

refs() { # TOOLS TEST SIZE REP
	local tool
	for tool in ${1//,/ }; do
		ref "$tool" "$2" "$3" "$4"
	done
}

# The KV rows' request shape, shared by rdmax's row and its relay reference, into the array
# named by the second argument. Requests of 2 MiB (16 KiB blocks) or 4 MiB (128 KiB blocks),
# one paged write of every layer's blocks each (the layers are one region), every byte
# checked; the decode sleeps between imms: its spin's yields took the daemons' CPU time.
# 16 MiB in flight either way (2 clients x window x request), within the 32 MiB L3 of the
# development machine, which the decode's check reads from (docs/benchmarks.md).
kv_args() { # SIZE ARRAY
	local -n into=$2
	into=(--clients 2 --one-job --decode-sleep --block-len "$1" -D "$secs")
	if [ "$1" -ge 131072 ]; then
		into+=(--layers 4 --blocks 8 --window 2)
	else
		into+=(--layers 8 --blocks 16 --window 4)
	fi
}

rdmax() { # TEST SIZE REP
	local test=$1 size=$2 rep=$3 file="$out/host-rdmax-$1-$2-r$3.json"
	local -a args=(-s "$size" --daemon-pid "${pids[0]}" --label "host $test"
		--json="$file.tmp")
	case $test in
	tcp_write) args=(run --socket "$run/a.sock" --desc "$run/b.desc" -o write -w 64 -b 16
		-D "$secs" --peer-daemon-pid "${pids[1]}" "${args[@]}") ;;
	tcp_read) args=(run --socket "$run/a.sock" --desc "$run/b.desc" -o read -w 64 -b 16
		-D "$secs" --peer-daemon-pid "${pids[1]}" "${args[@]}") ;;
	tcp_lat) args=(run --socket "$run/a.sock" --desc "$run/b.desc" -o write --lat -n 5000
		--peer-daemon-pid "${pids[1]}" "${args[@]}") ;;
	tcp_paged) args=(run --socket "$run/a.sock" --desc "$run/b.desc" -o paged --page-len 32K
		-w 64 -b 16 -D "$secs" --peer-daemon-pid "${pids[1]}" "${args[@]}") ;;
	tcp_paged_read) args=(run --socket "$run/a.sock" --desc "$run/b.desc" -o paged_read
		--page-len 32K -w 64 -b 16 -D "$secs" --peer-daemon-pid "${pids[1]}" "${args[@]}") ;;
	same_node) args=(local --socket "$run/a.sock" -o write -w 64 -b 16 -D "$secs" "${args[@]}") ;;
	tcp_kv)
		local -a kv
		kv_args "$size" kv
		args=(kv --socket "$run/a.sock" --decode-socket "$run/b.sock" "${kv[@]}"
			--daemon-pid "${pids[0]}" --peer-daemon-pid "${pids[1]}" --label "host $test"
			--json="$file.tmp")
		;;
	esac
	local stages0=''
	[ "$test" = tcp_lat ] && stages0=$(stage_sums "$run/a-admin.sock")
	if ! timeout 120 "$build/rdmax-bench" "${args[@]}" >"$run/bench.out" 2>&1; then
		echo "host: rdmax-bench $test $size B failed: $(tail -n 3 "$run/bench.out" | tr '\n' ' ')"
		rm -f "$file.tmp"
		host_failed=1
		return 1
	fi
	mv "$file.tmp" "$file"
	# Where daemon a's share of the completed 64 B write went ([metrics] job_stages).
	[ -n "$stages0" ] && stage_means "$stages0" "$(stage_sums "$run/a-admin.sock")" \
		"$out/host-stages-$test-$size-r$rep.json"
	return 0
}

# The cost of tcp_encryption = on: WRITEs between a second pair of daemons with TLS
# (userspace OpenSSL on a host without kernel TLS) against the plain pair, run
# back to back per repetition; the plain run is this row's reference ("plain").
tls_rows() {
	local size rep tserve file plain
	local -a common
	printf 'bench-tls-key-%s\n' "$RANDOM$RANDOM$RANDOM" >"$run/tls.key" && chmod 600 "$run/tls.key"
	local first=${#pids[@]}
	if ! start_daemon ta "host tls rows" --log-level info --auth-key-file "$run/tls.key" \
		--set transport.tcp_encryption=on ||
		! start_daemon tb "host tls rows" --log-level info --auth-key-file "$run/tls.key" \
			--set transport.tcp_encryption=on; then
		host_failed=1
		return 1
	fi
	"$build/rdmax-bench" serve --socket "$run/tb.sock" --desc "$run/tb.desc" --size 8M \
		2>"$run/tserve.log" &
	tserve=$!
	for size in 1048576 65536; do
		for ((rep = 1; rep <= reps; rep++)); do
			common=(run -o write -w 64 -b 16 -D "$secs" -s "$size")
			file="$out/host-rdmax-tcp_tls-$size-r$rep.json"
			plain="$out/host-ref@plain-tcp_tls-$size-r$rep.json"
			timeout 120 "$build/rdmax-bench" "${common[@]}" --socket "$run/a.sock" \
				--desc "$run/b.desc" --daemon-pid "${pids[0]}" --peer-daemon-pid "${pids[1]}" \
				--label "host tcp_tls plain" --json="$plain" >"$run/bench.out" 2>&1 ||
				echo "host: plain TCP run for tcp_tls $size B failed: $(tail -n 2 "$run/bench.out" | tr '\n' ' ')"
			if ! timeout 120 "$build/rdmax-bench" "${common[@]}" --socket "$run/ta.sock" \
				--desc "$run/tb.desc" --daemon-pid "${pids[first]}" \
				--peer-daemon-pid "${pids[first + 1]}" --label "host tcp_tls" \
				--json="$file" >"$run/bench.out" 2>&1; then
				echo "host: rdmax-bench tcp_tls $size B failed: $(tail -n 3 "$run/bench.out" | tr '\n' ' ')"
				rm -f "$file"
				host_failed=1
			fi
		done
		echo "host: tcp_tls $size B done ($(grep -o 'data path [a-z_]*' "$run/ta.log" | sort -u | tr '\n' ' '))"
	done
	kill -TERM "$tserve" 2>/dev/null
	wait "$tserve" 2>/dev/null
}

# TEST SIZE REFERENCES [REPS]. Missing tools (iperf3, ucx_perftest) leave their rows out.
# The rows the TCP targets are read from (tcp@1MiB, tcp_vs_ucx, tcp_vs_best; kv_tcp, the
# worse of its two rows) run twice the repetitions: on a shared host single 1 s runs
# of one build move by a third.
plan=(
	"tcp_write 1048576 tcp-stream,spin,iperf3,ucxtag,ucxput $((reps * 2))"
	"tcp_write 65536 tcp-stream,spin,spinbatch,iperf3,ucxtag"
	"tcp_write 4096 tcp-stream,spin,spinbatch"
	"tcp_write 8388608 spin,iperf3"
	"tcp_read 1048576 spin"
	"tcp_read 65536 spin"
	"tcp_lat 64 tcp-stream,spin,ucxtag,ucxput"
	"tcp_paged 1048576 spin,iperf3"
	"tcp_paged_read 1048576 spin,iperf3"
	"tcp_kv 16384 iperf3,span,spinspan,relay $((reps * 2))"
	"tcp_kv 131072 iperf3,span,spinspan,relay $((reps * 2))"
	"same_node 1048576 -"
	"same_node 65536 -"
)
iperf_secs=$(awk -v s="$secs" 'BEGIN { printf "%d", s < 1 ? 1 : s + 0.5 }')
tools_missing=
command -v iperf3 >/dev/null || tools_missing+=" iperf3"
command -v ucx_perftest >/dev/null || tools_missing+=" ucxtag ucxput"
[ -x /usr/bin/time ] || tools_missing+=" ucxtag ucxput"
[ -n "$tools_missing" ] && echo "SKIP host references:$tools_missing (not installed: tools/install-deps)"
available() { # TOOLS: those installed
	local t keep=
	for t in ${1//,/ }; do
		[[ " $tools_missing " == *" $t "* ]] || keep+=${keep:+,}$t
	done
	echo "$keep"
}

# Both with their own admin socket; a's job stages are read around the tcp_lat runs.
stage_set=(--set metrics.job_stages=true)
if start_daemon a "host part" --set "daemon.admin_socket=$run/a-admin.sock" "${stage_set[@]}" &&
	start_daemon b "host part" --set "daemon.admin_socket=$run/b-admin.sock" "${stage_set[@]}"; then
	"$build/rdmax-bench" serve --socket "$run/b.sock" --desc "$run/b.desc" --size 8M \
		2>"$run/serve.log" &
	serve_pid=$!
	for item in "${plan[@]}"; do
		read -r test size tools row_reps <<<"$item"
		tools=$(available "$tools")
		for ((rep = 1; rep <= ${row_reps:-$reps}; rep++)); do
			if [ "$test" = same_node ]; then
				rdmax "$test" "$size" "$rep" # memcpy runs inside, right after
			elif ((rep % 2)); then
				refs "$tools" "$test" "$size" "$rep"
				rdmax "$test" "$size" "$rep"
			else
				rdmax "$test" "$size" "$rep"
				refs "$tools" "$test" "$size" "$rep"
			fi
		done
		echo "host: $test $size B done"
	done
	tls_rows
else
	host_failed=1
fi
cleanup
trap cc_restore EXIT # the scaling and qos parts run under the same congestion control
echo "== host part took $(($(date +%s) - t0)) s"

# ---- (c) scaling: 1, 2, 4, 8 clients on one daemon, and its memory ----
echo "== scaling part: 1/2/4/8 client processes on one daemon (TCP, loopback)"
t0=$(date +%s)
RDMAX_BUILD=$build RDMAX_BENCH_OUT=$out RDMAX_BENCH_SECONDS=$secs tests/bench/scaling.sh ||
	host_failed=1
echo "== scaling part took $(($(date +%s) - t0)) s"

# ---- (d) traffic classes: latency writes under a bulk load, [qos] off, on, pinned, nodes ----
echo "== qos part: latency-class 64 KiB writes under bulk-class 8 MiB writes (TCP, loopback)"
t0=$(date +%s)
RDMAX_BUILD=$build RDMAX_BENCH_OUT=$out RDMAX_BENCH_SECONDS=$secs tests/bench/qos.sh ||
	host_failed=1
echo "== qos part took $(($(date +%s) - t0)) s"
cc_restore
trap - EXIT

# ---- (e) traffic classes over verbs, in the Soft-RoCE guest ----
echo "== qos part over verbs: the same in a Soft-RoCE guest (rxe0 -> rxe1), against perftest"
t0=$(date +%s)
if [ "${RDMAX_BENCH_SKIP_GUEST:-0}" = 1 ]; then
	echo "SKIP qos part over verbs: RDMAX_BENCH_SKIP_GUEST=1"
elif [ -n "${RDMAX_BENCH_ONLY:-}" ] && [[ " $RDMAX_BENCH_ONLY " != *" qos_verbs "* ]]; then
	echo "SKIP qos part over verbs: RDMAX_BENCH_ONLY does not name qos_verbs"
elif [ -n "$guest_out_why" ]; then
	echo "SKIP qos part over verbs: $guest_out_why"
elif [ ! -x tests/vm/run-in-guest ]; then
	echo "SKIP qos part over verbs: tests/vm/run-in-guest is missing"
else
	tests/vm/run-in-guest --two-nodes --timeout "${RDMAX_BENCH_QOS_VERBS_TIMEOUT:-480}" \
		-e RDMAX_BUILD="$build" -e RDMAX_BENCH_OUT="$out" -e RDMAX_BENCH_QOS_TRANSPORT=verbs \
		-e RDMAX_BENCH_QOS_REPS="${RDMAX_BENCH_QOS_VERBS_REPS:-2}" \
		-e RDMAX_BENCH_SECONDS="${RDMAX_BENCH_QOS_VERBS_SECONDS:-2}" \
		-- tests/bench/qos.sh 2>"$out/guest-qos-verbs.stderr"
	rc=$?
	case $rc in
	0) ;;
	125) echo "SKIP qos part over verbs: $(grep -m1 -o 'cannot start guest: .*' \
		"$out/guest-qos-verbs.stderr")" ;;
	*) echo "qos part over verbs: qos.sh exit $rc; tail of $out/guest-qos-verbs.stderr:"
		tail -n 5 "$out/guest-qos-verbs.stderr" | sed 's/^/    /' ;;
	esac
fi
echo "== qos part over verbs took $(($(date +%s) - t0)) s"
machine

echo "== results (medians of $reps runs; ratio: higher is better; raw data in $out)"
python3 tests/bench/report.py "$out"
exit $host_failed
