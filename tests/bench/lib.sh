# SPDX-License-Identifier: MIT
#
# lib.sh - shared by the host parts of `make bench` (run.sh, scaling.sh, qos.sh)
# and qos-trace.sh;
# sourced, not run. Expects $build, $run (a directory for sockets and logs)
# and a pids array in the caller.

# start_daemon NAME PART [RDMAXD-ARGS...]: an rdmaxd over TCP on loopback, socket
# $run/NAME.sock, its pid appended to pids; says "SKIP PART: ..." and fails when it
# does not start.
start_daemon() {
	local i
	# Port 0: the kernel picks free ports, descriptors carry them.
	"$build/rdmaxd" --node-name "$1" --socket "$run/$1.sock" --transport tcp \
		--listen 127.0.0.1 --port 0 --log-level notice "${@:3}" 2>"$run/$1.log" &
	pids+=($!)
	for ((i = 0; i < 100; i++)); do
		[ -S "$run/$1.sock" ] && return 0
		sleep 0.05
	done
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
