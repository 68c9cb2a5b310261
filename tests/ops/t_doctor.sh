#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rdmaxctl doctor on prepared sysfs trees (RDMAXCTL_SYSFS): a down port, a
# RoCE port without a RoCE v2 GID, an MTU mismatch, a daemon whose memlock
# limit is too small and a GPU without dma-buf or peermem are each reported
# with a fix, and a healthy node passes. The real node is checked too.
source "$(dirname "$0")/lib.sh"

put() { mkdir -p "$(dirname "$1")"; printf '%s\n' "$2" >"$1"; }

sick=$T/sys-sick
put "$sick/class/infiniband/mlx5_0/ports/1/state" "1: DOWN"
put "$sick/class/infiniband/mlx5_0/ports/1/link_layer" "Ethernet"
put "$sick/class/infiniband/mlx5_0/ports/1/gids/0" "fe80:0000:0000:0000:0a00:27ff:fe00:0001"
put "$sick/class/infiniband/mlx5_0/ports/1/gid_attrs/types/0" "IB/RoCE v1"
put "$sick/class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0" "eth0"
put "$sick/class/infiniband/mlx5_1/ports/1/state" "4: ACTIVE"
put "$sick/class/infiniband/mlx5_1/ports/1/link_layer" "Ethernet"
put "$sick/class/infiniband/mlx5_1/ports/1/gids/1" "0000:0000:0000:0000:0000:ffff:0a00:0002"
put "$sick/class/infiniband/mlx5_1/ports/1/gid_attrs/types/1" "RoCE v2"
put "$sick/class/infiniband/mlx5_1/ports/1/gid_attrs/ndevs/1" "eth1"
put "$sick/class/net/eth0/mtu" "9000"
put "$sick/class/net/eth1/mtu" "1500"
put "$sick/bus/pci/devices/0000:17:00.0/vendor" "0x10de"
put "$sick/bus/pci/devices/0000:17:00.0/class" "0x030200"

healthy=$T/sys-healthy
put "$healthy/class/infiniband/mlx5_0/ports/1/state" "4: ACTIVE"
put "$healthy/class/infiniband/mlx5_0/ports/1/link_layer" "InfiniBand"
mkdir -p "$healthy/bus/pci/devices"

# The daemon's memlock limit is read from /proc/PID/limits: 8 MiB here.
command -v prlimit >/dev/null || skip "prlimit is not installed"
prlimit --memlock=8388608:8388608 "$RDMAXD" --node-name small --socket "$T/small.sock" --port 0 \
	--transport tcp 2>"$T/small.log" &
track $!
wait_for 100 test -S "$T/small-admin.sock" || fail "daemon did not start"

rc=0
RDMAXCTL_SYSFS=$sick "$RDMAXCTL" --socket "$T/small-admin.sock" doctor >"$T/sick.txt" || rc=$?
[ "$rc" -eq 1 ] || fail "doctor on a sick node returned $rc, expected 1: $(cat "$T/sick.txt")"
grep -q '^\[FAIL\] port state: mlx5_0/1 is 1: DOWN' "$T/sick.txt" || fail "down port not reported"
grep -q '^\[ OK \] port state: mlx5_1/1 is 4: ACTIVE' "$T/sick.txt" || fail "active port not reported"
grep -q '^\[FAIL\] RoCE v2 GID: mlx5_0/1 has no RoCE v2 GID' "$T/sick.txt" || fail "missing RoCE v2 GID not reported"
grep -q 'fix: assign an IP address to eth0' "$T/sick.txt" || fail "no fix for the missing GID"
grep -q '^\[WARN\] MTU: mlx5_1/1 (eth1) has MTU 1500 but mlx5_0/1 has 9000' "$T/sick.txt" || fail "MTU mismatch not reported"
grep -q '^\[FAIL\] memlock: daemon (pid [0-9]*) may lock only 8192 KiB' "$T/sick.txt" || fail "memlock not reported"
grep -q 'fix: set LimitMEMLOCK=infinity' "$T/sick.txt" || fail "no fix for memlock"
if [ ! -e /proc/driver/nvidia/version ]; then
	grep -q '^\[WARN\] GPU memory: NVIDIA GPU present but neither dma-buf' "$T/sick.txt" ||
		fail "GPU without dma-buf/peermem not reported"
fi
grep -q '^UNHEALTHY: 3 problems' "$T/sick.txt" || fail "summary: $(tail -n 1 "$T/sick.txt")"
log "sick node: down port, missing RoCE v2 GID, MTU mismatch, memlock, GPU memory"

rc=0
RDMAXCTL_SYSFS=$sick "$RDMAXCTL" --socket "$T/small-admin.sock" --json doctor >"$T/sick.json" || rc=$?
[ "$rc" -eq 1 ] || fail "doctor --json on a sick node returned $rc"
json_check "$T/sick.json" 'j["ok"] is False and j["failures"] == 3 and all(c["result"] in ("ok","info","warn","fail") for c in j["checks"]) and all("fix" in c for c in j["checks"] if c["result"] == "fail")' ||
	fail "doctor JSON"
log "doctor --json: same findings, every failure with a fix"

if prlimit --memlock=unlimited:unlimited true 2>/dev/null; then
	prlimit --memlock=unlimited:unlimited "$RDMAXD" --node-name big --socket "$T/big.sock" --port 0 \
		--transport tcp 2>"$T/big.log" &
	track $!
	wait_for 100 test -S "$T/big-admin.sock" || fail "daemon did not start"
	RDMAXCTL_SYSFS=$healthy "$RDMAXCTL" --socket "$T/big-admin.sock" doctor >"$T/healthy.txt" ||
		fail "doctor on a healthy node failed: $(cat "$T/healthy.txt")"
	grep -q '^\[ OK \] memlock: daemon (pid [0-9]*) may lock unlimited memory' "$T/healthy.txt" ||
		fail "memlock OK line"
	grep -q '^healthy: 0 problems' "$T/healthy.txt" || fail "summary: $(tail -n 1 "$T/healthy.txt")"
	log "healthy node: exit 0"
else
	# No CAP_SYS_RESOURCE here (a container): the memlock limit cannot be raised,
	# so the healthy tree must show that one problem and nothing else.
	rc=0
	RDMAXCTL_SYSFS=$healthy "$RDMAXCTL" --socket "$T/small-admin.sock" --json doctor >"$T/healthy.json" || rc=$?
	[ "$rc" -eq 1 ] || fail "doctor on the healthy tree returned $rc"
	json_check "$T/healthy.json" '[c["check"] for c in j["checks"] if c["result"] == "fail"] == ["memlock"] and any(c["check"] == "port state" and c["result"] == "ok" for c in j["checks"])' ||
		fail "healthy tree: other problems than memlock"
	log "healthy node: only the memlock limit (cannot be raised in this container) is reported"
fi

rc=0
RDMAXCTL_SYSFS=$healthy "$RDMAXCTL" --socket "$T/none-admin.sock" doctor >"$T/down.txt" || rc=$?
[ "$rc" -eq 1 ] || fail "doctor without a daemon returned $rc, expected 1"
grep -q "^\[FAIL\] daemon: cannot connect to '$T/none-admin.sock'" "$T/down.txt" || fail "unreachable daemon not reported"
grep -q 'fix: start it: systemctl start rdmaxd' "$T/down.txt" || fail "no fix for an unreachable daemon"
log "no daemon: reported with how to start it"

# This machine, as it is: doctor must run and give a verdict either way.
rc=0
"$RDMAXCTL" --socket "$T/small-admin.sock" doctor >"$T/real.txt" || rc=$?
[ "$rc" -le 1 ] || fail "doctor on this node returned $rc"
grep -Eq '^(healthy|UNHEALTHY):' "$T/real.txt" || fail "doctor on this node gave no verdict"
log "this node: $(tail -n 1 "$T/real.txt")"
