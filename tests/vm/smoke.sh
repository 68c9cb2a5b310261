#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# smoke.sh - check that the RDMA devices the verbs tests will use work:
#   * ibv_devices lists every device in $RDMAX_GUEST_DEVS;
#   * port 1 of every device is PORT_ACTIVE (ibv_devinfo -d DEV);
#   * an ib_write_bw run completes: with two devices the server runs on
#     DEV1 (its IPv4 RoCE GID) and the client on DEV0, connecting to IP1;
#     with one device both ends run on DEV0 (loopback);
#   * in the Soft-RoCE guest with two devices, that traffic really went out
#     of NETDEV0 (over the veth pair, not looped inside one device).
# Prints PASS/FAIL lines and "N passed, M failed"; exits 1 if any failed.
#
# In the guest:              tests/vm/run-in-guest --two-nodes -- tests/vm/smoke.sh
# On a host with real NICs:  RDMAX_GUEST_DEVS="mlx5_0 mlx5_1" \
#                            RDMAX_GUEST_IP0=10.0.0.1 RDMAX_GUEST_IP1=10.0.0.2 \
#                            tests/vm/smoke.sh
# (DEV0/DEV1 default to the first/second name in RDMAX_GUEST_DEVS.)
# RDMAX_SMOKE_PORT sets perftest's TCP port (default 18515).
set -u

if [ -z "${RDMAX_GUEST_DEVS:-}" ]; then
	echo "smoke.sh: RDMAX_GUEST_DEVS is not set; run it with tests/vm/run-in-guest" \
		"or set the RDMAX_GUEST_* variables (see tests/vm/README.md)" >&2
	exit 2
fi
read -r -a DEVS <<<"$RDMAX_GUEST_DEVS"
DEV0=${RDMAX_GUEST_DEV0:-${DEVS[0]}}
DEV1=${RDMAX_GUEST_DEV1:-${DEVS[1]:-}}
IP0=${RDMAX_GUEST_IP0:-}
IP1=${RDMAX_GUEST_IP1:-}
PORT=${RDMAX_SMOKE_PORT:-18515}
SIZE=4096
ITERS=200

W=$(mktemp -d "${TMPDIR:-/tmp}/rdmax-smoke.XXXXXX") || exit 2
trap 'rm -rf "$W"' EXIT
PASSED=0
FAILED=0

# check NAME CMD...: run CMD with its output in a log; show the log's tail
# only when it fails.
check() {
	local name=$1
	shift
	if "$@" >"$W/check.log" 2>&1; then
		echo "PASS $name"
		PASSED=$((PASSED + 1))
	else
		echo "FAIL $name"
		tail -n 20 "$W/check.log" | sed 's/^/    /'
		FAILED=$((FAILED + 1))
	fi
}

listed() { # listed DEV: ibv_devices names DEV
	ibv_devices | awk 'NR > 2 { print $1 }' | grep -qx -- "$1"
}

port_active() { # port_active DEV
	ibv_devinfo -d "$1" -i 1 | tee /dev/stderr | grep -Eq 'state:[[:space:]]+PORT_ACTIVE'
}

gid_index() { # gid_index DEV IPV4: index of the RoCE GID of IPV4 (v2 preferred)
	local dev=$1 want f idx type first=
	local -a o
	IFS=. read -r -a o <<<"$2"
	[ ${#o[@]} = 4 ] || return 0
	want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' \
		"${o[0]}" "${o[1]}" "${o[2]}" "${o[3]}")
	for f in "/sys/class/infiniband/$dev/ports/1/gids/"*; do
		[ "$(cat "$f" 2>/dev/null)" = "$want" ] || continue
		idx=${f##*/}
		type=$(cat "/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$idx" 2>/dev/null)
		if [ "$type" = "RoCE v2" ]; then
			echo "$idx"
			return 0
		fi
		[ -n "$first" ] || first=$idx
	done
	[ -z "$first" ] || echo "$first"
}

# write_bw SRV_DEV SRV_IP CLI_DEV CLI_IP: ib_write_bw server on SRV_DEV,
# client on CLI_DEV connecting to SRV_IP; both must succeed.
write_bw() {
	local srv_dev=$1 srv_ip=$2 cli_dev=$3 cli_ip=$4 gid spid src crc i
	local -a common=(-F -s "$SIZE" -n "$ITERS" -p "$PORT" --report_gbits)
	local -a srv=(-d "$srv_dev" "${common[@]}") cli=(-d "$cli_dev" "${common[@]}")
	gid=$(gid_index "$srv_dev" "$srv_ip")
	[ -z "$gid" ] || srv+=(-x "$gid")
	gid=$(gid_index "$cli_dev" "$cli_ip")
	[ -z "$gid" ] || cli+=(-x "$gid")
	echo "server: ib_write_bw ${srv[*]}"
	echo "client: ib_write_bw ${cli[*]} $srv_ip"
	timeout 60 ib_write_bw "${srv[@]}" >"$W/server.log" 2>&1 &
	spid=$!
	# wait until the server listens (perftest's TCP exchange), 30 s at most
	for ((i = 0; i < 300; i++)); do
		ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q . && break
		kill -0 "$spid" 2>/dev/null || break
		sleep 0.1
	done
	timeout 60 ib_write_bw "${cli[@]}" "$srv_ip"
	crc=$?
	wait "$spid"
	src=$?
	echo "--- server output ---"
	cat "$W/server.log"
	echo "client exit $crc, server exit $src"
	[ "$crc" = 0 ] && [ "$src" = 0 ]
}

tx_bytes() { cat "/sys/class/net/$1/statistics/tx_bytes"; }
crossed() { # crossed BEFORE: NETDEV0 sent at least the payload since BEFORE
	local sent=$(( $(tx_bytes "$RDMAX_GUEST_NETDEV0") - $1 ))
	echo "$RDMAX_GUEST_NETDEV0 sent $sent bytes"
	[ "$sent" -ge $((SIZE * ITERS)) ]
}

for dev in "${DEVS[@]}"; do
	check "ibv_devices lists $dev" listed "$dev"
done
for dev in "${DEVS[@]}"; do
	check "$dev port 1 is PORT_ACTIVE" port_active "$dev"
done

if [ -n "$DEV1" ]; then
	if [ -z "$IP0" ] || [ -z "$IP1" ]; then
		check "RDMAX_GUEST_IP0 and RDMAX_GUEST_IP1 are set" false
	else
		guest_veth=
		if [ "${RDMAX_GUEST:-}" = 1 ] && [ -n "${RDMAX_GUEST_NETDEV0:-}" ]; then
			guest_veth=$RDMAX_GUEST_NETDEV0
			before=$(tx_bytes "$guest_veth")
		fi
		check "ib_write_bw $DEV0 -> $DEV1 ($IP1)" write_bw "$DEV1" "$IP1" "$DEV0" "$IP0"
		if [ -n "$guest_veth" ]; then
			check "that traffic crossed $guest_veth" crossed "$before"
		fi
	fi
elif [ -z "$IP0" ]; then
	check "RDMAX_GUEST_IP0 is set" false
else
	check "ib_write_bw $DEV0 loopback ($IP0)" write_bw "$DEV0" "$IP0" "$DEV0" "$IP0"
fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
