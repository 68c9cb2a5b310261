#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# keys.sh - what an attacker would have to guess on Soft-RoCE: the rkeys the
# daemons' memory regions get and the initial PSNs rdma_cm gives their queue
# pairs. Run in a two-node guest:
#   flock /tmp/rdmax-guest.lock tests/vm/run-in-guest --two-nodes -- tests/vm/keys.sh
# Each round starts two rdmaxd (verbs, one per device), moves data between
# them with rdmax-bench, and prints every MR's rkey and every RC QP's send and
# receive PSN (from `rdma resource`), then stops them. Exit 0 done, 1 error.
set -u

build=${RDMAX_BUILD:-build}
rounds=${RDMAX_KEYS_ROUNDS:-3}
run=$(mktemp -d /tmp/rdmax-keys.XXXXXX) || exit 1
pids=()

stop_all() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null
	done
	wait 2>/dev/null
	pids=()
}
trap stop_all EXIT

start_daemon() { # NAME DEV IP
	"$build/rdmaxd" --node-name "$1" --socket "$run/$1.sock" --transport verbs \
		--listen "$3" --port 0 --set "verbs.devices=$2" --log-level notice \
		2>"$run/$1.log" &
	pids+=($!)
	for ((i = 0; i < 100; i++)); do
		[ -S "$run/$1.sock" ] && return 0
		sleep 0.05
	done
	echo "rdmaxd '$1' did not start: $(tail -n 2 "$run/$1.log")" >&2
	return 1
}

for ((r = 1; r <= rounds; r++)); do
	start_daemon a rxe0 192.0.2.1 || exit 1
	start_daemon b rxe1 192.0.2.2 || exit 1
	rm -f "$run/b.desc"
	"$build/rdmax-bench" serve --socket "$run/b.sock" --desc "$run/b.desc" --size 1M \
		2>"$run/serve.log" &
	pids+=($!)
	for ((i = 0; i < 100; i++)); do
		[ -s "$run/b.desc" ] && break
		sleep 0.05
	done
	timeout 60 "$build/rdmax-bench" run --socket "$run/a.sock" --desc "$run/b.desc" \
		-s 64K -n 20 >/dev/null 2>"$run/bench.log" ||
		{ echo "round $r: rdmax-bench failed: $(tail -n 2 "$run/bench.log")" >&2; exit 1; }
	echo "round $r MRs (device rkey lkey length):"
	rdma -d resource show mr 2>/dev/null | awk '{
		dev=""; rk=""; lk=""; len="";
		for (i = 1; i < NF; i++) {
			if ($i == "dev") dev = $(i+1);
			if ($i == "rkey") rk = $(i+1);
			if ($i == "lkey") lk = $(i+1);
			if ($i == "mrlen") len = $(i+1);
		}
		if (rk != "") print "  " dev, rk, lk, len }'
	echo "round $r QPs (device lqpn rqpn sq-psn rq-psn):"
	rdma -d resource show qp 2>/dev/null | awk '/type RC/ {
		dev=""; l=""; rq=""; sp=""; rp="";
		for (i = 1; i < NF; i++) {
			if ($i == "link") dev = $(i+1);
			if ($i == "lqpn") l = $(i+1);
			if ($i == "rqpn") rq = $(i+1);
			if ($i == "sq-psn") sp = $(i+1);
			if ($i == "rq-psn") rp = $(i+1);
		}
		print "  " dev, l, rq, sp, rp }'
	stop_all
done
exit 0
