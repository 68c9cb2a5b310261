#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `make demo`: two rdmaxd on this machine (two sockets, two TCP ports on
# loopback), a KV-cache-like push from one to the other with an imm counter the
# receiver waits on, every byte verified, then a clean shutdown.
set -euo pipefail

build=${RDMAX_BUILD:-build}
transport=${RDMAX_DEMO_TRANSPORT:-tcp}
addr_a=${RDMAX_DEMO_ADDR_A:-127.0.0.1}
addr_b=${RDMAX_DEMO_ADDR_B:-127.0.0.1}
dir=$(mktemp -d /tmp/rdmax-demo.XXXXXX)
pids=()

cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$dir"
}
trap cleanup EXIT

start_daemon() { # name addr port
	"$build/rdmaxd" --node-name "$1" --socket "$dir/$1.sock" --transport "$transport" \
		--listen "$2" --port "$3" --log-level notice 2>"$dir/$1.log" &
	pids+=($!)
	for _ in $(seq 100); do
		[ -S "$dir/$1.sock" ] && return 0
		sleep 0.05
	done
	echo "demo: daemon $1 did not start:" >&2
	cat "$dir/$1.log" >&2
	exit 1
}

echo "== starting two daemons: prefill ($addr_a:17471) and decode ($addr_b:17472), transport $transport"
start_daemon prefill "$addr_a" 17471
start_daemon decode "$addr_b" 17472

"$build/rdmax-demo" receive --socket "$dir/decode.sock" --desc "$dir/kv.desc" >"$dir/receive.out" &
receiver=$!
"$build/rdmax-demo" send --socket "$dir/prefill.sock" --desc "$dir/kv.desc" | tee "$dir/send.out"
wait "$receiver"
cat "$dir/receive.out"

sent=$(grep -o 'checksum [0-9a-f]*' "$dir/send.out" | awk '{print $2}')
got=$(grep -o 'checksum [0-9a-f]*' "$dir/receive.out" | awk '{print $2}')
if [ -z "$sent" ] || [ "$sent" != "$got" ]; then
	echo "demo: FAILED: checksum sent $sent, received $got" >&2
	exit 1
fi

echo "== stopping the daemons"
for p in "${pids[@]}"; do kill -TERM "$p"; done
for p in "${pids[@]}"; do wait "$p"; done
pids=()
echo "demo: OK: checksums match ($sent), both daemons stopped cleanly"
