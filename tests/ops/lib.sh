# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Helpers shared by the operations tests (sourced). Each test is a bash script
# that exits 0 (pass), 77 (skip, with the reason printed) or anything else
# (fail). Daemons and helpers started through these functions are stopped on
# exit, and every test gets its own world-readable temporary directory.
set -euo pipefail

BUILD=${RDMAX_BUILD:-build}
BUILD=$(cd "$BUILD" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RDMAXD=$BUILD/rdmaxd
RDMAXCTL=$BUILD/rdmaxctl
OPS_DIR=$ROOT/tests/ops

T=$(mktemp -d /tmp/rdmax-ops.XXXXXX)
chmod 0755 "$T"
_pids=()

_cleanup() {
	local p
	for p in "${_pids[@]}"; do
		kill -CONT "$p" 2>/dev/null || true
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in "${_pids[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	if [ "${KEEP_TMP:-0}" = 1 ]; then
		echo "kept $T"
	else
		rm -rf "$T"
	fi
}
trap _cleanup EXIT

log() { echo "  $*"; }
fail() {
	echo "FAIL: $*" >&2
	local f
	for f in "$T"/*.log; do
		[ -e "$f" ] || continue
		echo "--- $f (last 30 lines)" >&2
		tail -n 30 "$f" >&2
	done
	exit 1
}
skip() {
	echo "SKIP: $*"
	exit 77
}
track() { _pids+=("$1"); }

# Wait until a command succeeds (up to $1 tenths of a second).
wait_for() {
	local tries=$1
	shift
	while [ "$tries" -gt 0 ]; do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.1
		tries=$((tries - 1))
	done
	return 1
}

# start_daemon NAME [extra rdmaxd options...]: socket $T/NAME.sock, admin $T/NAME-admin.sock.
start_daemon() {
	local name=$1
	shift
	"$RDMAXD" --node-name "$name" --socket "$T/$name.sock" --port 0 --transport tcp \
		"$@" 2>"$T/$name.log" &
	local pid=$!
	track "$pid"
	eval "PID_$name=$pid"
	wait_for 100 test -S "$T/$name-admin.sock" || fail "daemon $name did not start"
}

stop_daemon() { # NAME: SIGTERM, wait, expect exit status 0
	local pid
	eval "pid=\$PID_$1"
	kill -TERM "$pid"
	local rc=0
	wait "$pid" || rc=$?
	[ "$rc" -eq 0 ] || fail "daemon $1 exited with status $rc"
}

ctl() { # NAME args...: rdmaxctl against daemon NAME
	local name=$1
	shift
	"$RDMAXCTL" --socket "$T/$name-admin.sock" "$@"
}

# json_check FILE PYTHON-EXPR: load FILE as JSON into `j` and assert the expression.
json_check() {
	python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
ok = eval(sys.argv[2])
if not ok:
    print("assertion failed: %s\n%s" % (sys.argv[2], json.dumps(j, indent=1)[:3000]))
    sys.exit(1)
' "$1" "$2"
}

# A promtool binary: from PATH, from an earlier download, or unpacked from
# Debian's prometheus package (without installing it, so no service starts).
find_promtool() {
	if command -v promtool >/dev/null 2>&1; then
		command -v promtool
		return 0
	fi
	local cache=$BUILD/ops-tools
	if [ -x "$cache/promtool" ]; then
		echo "$cache/promtool"
		return 0
	fi
	mkdir -p "$cache/dl"
	(cd "$cache/dl" && apt-get download prometheus >/dev/null 2>&1) || return 1
	dpkg -x "$cache"/dl/prometheus_*.deb "$cache/dl/x" || return 1
	cp "$cache/dl/x/usr/bin/promtool" "$cache/promtool"
	rm -rf "$cache/dl"
	echo "$cache/promtool"
}
