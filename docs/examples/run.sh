#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `make run-examples`: three rdmaxd on this machine (three sockets, three TCP
# ports), started the way tools/demo.sh starts them, then every example of
# docs/examples against them, then a clean shutdown. Fails on the first
# example that fails or whose two sides disagree.
set -euo pipefail

build=${RDMAX_BUILD:-build}
transport=${RDMAX_DEMO_TRANSPORT:-tcp}
addr=${RDMAX_DEMO_ADDR:-127.0.0.1}
ex="$build/examples"
dir=$(mktemp -d /tmp/rdmax-examples.XXXXXX)
pids=()

cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$dir"
}
trap cleanup EXIT

start_daemon() { # name port
	"$build/rdmaxd" --node-name "$1" --socket "$dir/$1.sock" --transport "$transport" \
		--listen "$addr" --port "$2" --log-level notice \
		--set "daemon.admin_socket=$dir/$1.admin.sock" 2>"$dir/$1.log" &
	pids+=($!)
	for _ in $(seq 100); do
		[ -S "$dir/$1.sock" ] && return 0
		sleep 0.05
	done
	echo "examples: daemon $1 did not start:" >&2
	cat "$dir/$1.log" >&2
	exit 1
}

checksum_of() { grep -o 'checksum [0-9a-f]*' "$1" | awk '{print $2}' | sort -u; }

echo "== starting three daemons on $addr (ports 17481-17483), transport $transport"
start_daemon n0 17481
start_daemon n1 17482
start_daemon n2 17483

echo "== kv_cache_push: prefill on n0 -> decode on n1, one imm per layer"
"$ex/kv_cache_push" decode --socket "$dir/n1.sock" --desc "$dir/kv.desc" >"$dir/decode.out" &
decode=$!
"$ex/kv_cache_push" prefill --socket "$dir/n0.sock" --desc "$dir/kv.desc" | tee "$dir/prefill.out"
wait "$decode"
cat "$dir/decode.out"
[ "$(checksum_of "$dir/prefill.out")" = "$(checksum_of "$dir/decode.out")" ] || {
	echo "examples: kv_cache_push: checksums differ" >&2
	exit 1
}

for mode in scatter writes; do
	echo "== weight_broadcast ($mode): n0 -> n1, n2 and a second client on n0"
	rm -f "$dir"/w*.desc
	recvs=()
	for n in n1 n2 n0; do
		"$ex/weight_broadcast" receive --socket "$dir/$n.sock" --desc "$dir/w-$n.desc" \
			--bytes 16777216 >"$dir/w-$n.out" &
		recvs+=($!)
	done
	flag=()
	[ "$mode" = writes ] && flag=(--writes)
	"$ex/weight_broadcast" send --socket "$dir/n0.sock" --bytes 16777216 "${flag[@]}" \
		"$dir/w-n1.desc" "$dir/w-n2.desc" "$dir/w-n0.desc" | tee "$dir/w-send.out"
	for p in "${recvs[@]}"; do wait "$p"; done
	cat "$dir"/w-n*.out
	sums=$(cat "$dir"/w-send.out "$dir"/w-n*.out | grep -o 'checksum [0-9a-f]*' | sort -u | wc -l)
	[ "$sums" = 1 ] || {
		echo "examples: weight_broadcast: checksums differ" >&2
		exit 1
	}
done

echo "== moe_dispatch: 3 ranks on n0, n1, n2 (scatter + barrier per round)"
mkdir -p "$dir/moe"
ranks=()
for r in 0 1 2; do
	"$ex/moe_dispatch" --socket "$dir/n$r.sock" --dir "$dir/moe" --rank "$r" --world 3 \
		--rounds 4 &
	ranks+=($!)
done
for p in "${ranks[@]}"; do wait "$p"; done

if [ -e "$build/python/rdmax/__init__.py" ]; then
	echo "== kv_prefill_decode.py: rdmax.kv, prefill on n0 <-> decode on n1 (push and pull)"
	mkdir -p "$dir/kv"
	# A sanitized build (make SAN=1): the package carries ASan, whose runtime must load
	# before Python's; Python's own allocations at exit are not ours to judge.
	pyenv=(PYTHONPATH="$build/python")
	if ldd "$build/librdmax.so.2" | grep -q libasan; then
		pyenv+=(LD_PRELOAD="$(${CC:-cc} -print-file-name=libasan.so) $(${CC:-cc} -print-file-name=libubsan.so)"
			ASAN_OPTIONS=detect_leaks=0)
	fi
	env "${pyenv[@]}" /usr/bin/python3 docs/examples/kv_prefill_decode.py decode \
		--socket "$dir/n1.sock" --dir "$dir/kv" >"$dir/kv-decode.out" &
	kvd=$!
	env "${pyenv[@]}" /usr/bin/python3 docs/examples/kv_prefill_decode.py prefill \
		--socket "$dir/n0.sock" --dir "$dir/kv" | tee "$dir/kv-prefill.out"
	wait "$kvd"
	cat "$dir/kv-decode.out"
	[ "$(checksum_of "$dir/kv-prefill.out")" = "$(checksum_of "$dir/kv-decode.out")" ] || {
		echo "examples: kv_prefill_decode.py: checksums differ" >&2
		exit 1
	}
else
	echo "examples: the rdmax Python package is not built (python3-dev missing)" >&2
	exit 1
fi

echo "== stopping the daemons"
for p in "${pids[@]}"; do kill -TERM "$p"; done
for p in "${pids[@]}"; do wait "$p"; done
pids=()
echo "examples: OK"
