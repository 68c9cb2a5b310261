#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# GPU memory check for a node with an NVIDIA GPU (docs/gpu.md). Reports what
# the node offers (driver, open kernel module, kernel, rdma-core,
# nvidia_peermem, RDMA devices), then runs tests/gpu/check-gpu.c: allocate GPU
# memory, export it as a dma-buf, hand it to a child without CUDA, check the
# fd, register it with ibv_reg_dmabuf_mr() and RDMA-write into it over a
# loopback QP (where /dev/infiniband exists), read it back through CUDA, and
# free it in the parent while the child still holds it.
#
# Every step prints PASS, FAIL or SKIP with its reason; steps whose hardware
# is absent are skipped. Exit status 0 when nothing failed (a node without a
# GPU skips everything and exits 0), 1 otherwise. Not part of `make check`.
#
# Environment: RDMAX_BUILD (build folder, default build), RDMAX_GPU_CHECK_DEVICE
# (RDMA device to use, default the first that opens).
set -u

cd "$(dirname "$0")/../.." || exit 1
BUILD=${RDMAX_BUILD:-build}
HELPER=$BUILD/tests/gpu/check-gpu
pass=0
fail=0
skip=0

result() { # NAME VERDICT DETAIL
	printf 'step: %s: %s: %s\n' "$1" "$2" "$3"
	case $2 in
	PASS) pass=$((pass + 1)) ;;
	FAIL) fail=$((fail + 1)) ;;
	*) skip=$((skip + 1)) ;;
	esac
}

# "a.b.c" >= "x.y": version_ge A B
version_ge() {
	[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

echo "== node"
gpu_present=0
if [ -r /proc/driver/nvidia/version ]; then
	gpu_present=1
	drv=$(head -n1 /proc/driver/nvidia/version)
	result nvidia-driver PASS "$drv"
	if grep -q 'Open Kernel Module' /proc/driver/nvidia/version; then
		result open-kernel-module PASS "dma-buf export possible"
	else
		result open-kernel-module SKIP "proprietary module: no dma-buf export; only the peermem path can work"
	fi
else
	result nvidia-driver SKIP "no NVIDIA driver loaded (/proc/driver/nvidia/version missing): no GPU on this node"
	result open-kernel-module SKIP "no NVIDIA driver"
fi

kernel=$(uname -r)
kver=${kernel%%-*}
if version_ge "$kver" 5.12; then
	result kernel PASS "Linux $kernel (dma-buf MRs need 5.12 or later)"
elif [ $gpu_present = 1 ]; then
	result kernel FAIL "Linux $kernel is older than 5.12: no dma-buf MRs (the peermem fallback may still work)"
else
	result kernel SKIP "Linux $kernel is older than 5.12 (no GPU here anyway)"
fi

# libibverbs' version is 1.<abi>.<rdma-core release>.0, e.g. 1.14.44.0 for rdma-core 44.
ibverbs=$(pkg-config --modversion libibverbs 2>/dev/null || true)
if [ -z "$ibverbs" ]; then
	ibverbs=$(find /usr/lib /usr/lib64 -maxdepth 2 -name 'libibverbs.so.1.*' 2>/dev/null |
		sed -n 's/.*libibverbs\.so\.\(1\.[0-9.]*\)$/\1/p' | head -n1)
fi
release=$(echo "$ibverbs" | cut -d. -f3)
if [ -z "$ibverbs" ] || [ -z "$release" ]; then
	result rdma-core SKIP "libibverbs not found${ibverbs:+ (version $ibverbs)}"
elif [ "$release" -ge 34 ]; then
	result rdma-core PASS "rdma-core $release (libibverbs $ibverbs): ibv_reg_dmabuf_mr() present"
else
	result rdma-core FAIL "rdma-core $release is older than 34: no ibv_reg_dmabuf_mr()"
fi

if [ -e /sys/kernel/mm/memory_peers/nv_mem/version ] || [ -e /sys/module/nvidia_peermem ]; then
	result nvidia-peermem PASS "loaded: the CUDA IPC fallback path is available"
else
	result nvidia-peermem SKIP "not loaded (only the fallback path needs it: modprobe nvidia_peermem)"
fi

if [ -d /dev/infiniband ] && [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
	result rdma-devices PASS "$(find /sys/class/infiniband -mindepth 1 -maxdepth 1 -printf '%f ')"
else
	result rdma-devices SKIP "no /dev/infiniband: registration and the loopback write are skipped"
fi

echo "== GPU memory (tests/gpu/check-gpu.c)"
if [ ! -x "$HELPER" ]; then
	make -s "$HELPER" >/dev/null 2>&1 || true
fi
if [ ! -x "$HELPER" ]; then
	result helper FAIL "$HELPER is missing and could not be built (make $HELPER)"
else
	out=$("$HELPER" 2>&1)
	rc=$?
	printf '%s\n' "$out"
	pass=$((pass + $(printf '%s\n' "$out" | grep -c '^step: .*: PASS: ')))
	fail=$((fail + $(printf '%s\n' "$out" | grep -c '^step: .*: FAIL: ')))
	skip=$((skip + $(printf '%s\n' "$out" | grep -c '^step: .*: SKIP: ')))
	if [ $rc -ne 0 ] && ! printf '%s\n' "$out" | grep -q ': FAIL: '; then
		result helper FAIL "$HELPER exited with status $rc"
	fi
fi

echo "== summary"
echo "check-gpu: $pass passed, $skip skipped, $fail failed"
if [ $gpu_present = 0 ]; then
	echo "check-gpu: no NVIDIA GPU on this node: nothing to check (not a failure)"
fi
[ $fail -eq 0 ]
