# SPDX-License-Identifier: MIT
#
# lib.sh - shared by the parts of `make bench` (run.sh, scaling.sh, qos.sh, and
# guest.sh in the Soft-RoCE guest, which starts its daemons with a
# start_daemon of its own), qos-trace.sh, guest-hop.sh (wait_line) and
# tests/run-verbs-suite (gid_index); sourced, not run. Its daemon starters expect $build, $run (a
# directory for sockets and logs) and a pids array in the caller.

# start_daemon NAME PART [RDMAXD-ARGS...]: an rdmaxd over TCP on loopback, socket
# $run/NAME.sock, its pid appended to pids; says "SKIP PART: ..." and fails when it
# does not start.
start_daemon() {
	# Port 0: the kernel picks free ports, descriptors carry them.
	"$build/rdmaxd" --node-name "$1" --socket "$run/$1.sock" --transport tcp \
		--listen 127.0.0.1 --port 0 --log-level notice "${@:3}" 2>"$run/$1.log" &
	pids+=($!)
	wait_socket "$run/$1.sock" "${pids[-1]}" && return 0
	echo "SKIP $2: rdmaxd '$1' did not start: $(tail -n 2 "$run/$1.log" | tr '\n' ' ')"
	return 1
}

# start_serve DAEMON NAME SIZE PART: `rdmax-bench serve` of a SIZE region on daemon
# DAEMON ($run/DAEMON.sock), its descriptor in $run/NAME.desc, its pid appended to
# pids; says "SKIP PART: ..." and fails when no descriptor appears.
start_serve() {
	local i
	rm -f "$run/$2.desc"
	"$build/rdmax-bench" serve --socket "$run/$1.sock" --desc "$run/$2.desc" --size "$3" \
		2>"$run/serve-$2.log" &
	pids+=($!)
	for ((i = 0; i < 100; i++)); do
		[ -s "$run/$2.desc" ] && return 0
		sleep 0.05
	done
	echo "SKIP $4: serve $2 did not publish its descriptor"
	return 1
}

# wait_socket SOCKET PID: until the Unix socket SOCKET exists (5 s at most), or PID died.
wait_socket() {
	local i
	for ((i = 0; i < 100; i++)); do
		[ -S "$1" ] && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

# wait_listen PORT PID: until a TCP server listens on PORT, or PID died (15 s at most).
wait_listen() {
	local i
	for ((i = 0; i < 300; i++)); do
		ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

# wait_line FILE PID TEXT: until FILE has a line TEXT (a server that says it
# listens, where no socket shows it: rdma_listen), or PID died (15 s at most).
wait_line() {
	local i
	for ((i = 0; i < 300; i++)); do
		grep -qx "$3" "$1" 2>/dev/null && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

# gid_index DEV IPV4: the index of the RoCE v2 GID of IPV4 on DEV's port 1 (perftest's -x).
gid_index() {
	local dev=$1 want f idx
	local -a o
	IFS=. read -r -a o <<<"$2"
	[ ${#o[@]} = 4 ] || return 0
	want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' \
		"${o[0]}" "${o[1]}" "${o[2]}" "${o[3]}")
	for f in "/sys/class/infiniband/$dev/ports/1/gids/"*; do
		[ "$(cat "$f" 2>/dev/null)" = "$want" ] || continue
		idx=${f##*/}
		if [ "$(cat "/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$idx" 2>/dev/null)" = \
			"RoCE v2" ]; then
			echo "$idx"
			return 0
		fi
	done
}

# stage_sums ADMIN_SOCKET: that daemon's job-stage histograms ([metrics] job_stages),
# as "stage_sum S stage_count N" pairs on one line (nothing when it cannot answer).
stage_sums() {
	"$build/rdmaxctl" --socket "$1" stats --prometheus 2>/dev/null |
		sed -n 's/^rdmaxd_job_stage_seconds_\(sum\|count\){stage="\([a-z]*\)"} /\2_\1 /p' |
		tr '\n' ' '
}

# stage_means BEFORE AFTER FILE: the mean of each stage over the jobs between two
# stage_sums readings (µs), as JSON in FILE: where the daemon's share of a job went.
stage_means() {
	awk -v before="$1" -v after="$2" 'BEGIN {
		n = split(before, b, " "); for (i = 1; i < n; i += 2) v0[b[i]] = b[i + 1]
		n = split(after, a, " "); for (i = 1; i < n; i += 2) v1[a[i]] = a[i + 1]
		jobs = v1["post_count"] - v0["post_count"]
		if (jobs <= 0) exit 1
		printf "{\"jobs\": %d", jobs
		split("queue post complete", st, " ")
		for (i = 1; i <= 3; i++)
			printf ", \"%s_us\": %.3f", st[i], (v1[st[i] "_sum"] - v0[st[i] "_sum"]) / jobs * 1e6
		print "}"
	}' >"$3.tmp" && mv "$3.tmp" "$3"
	rm -f "$3.tmp"
}
