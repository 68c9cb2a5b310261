#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The shipped units pass `systemd-analyze verify` (offline: no running systemd
# is needed), and the socket units name their sockets as rdmaxd expects.
source "$(dirname "$0")/lib.sh"

command -v systemd-analyze >/dev/null || skip "systemd-analyze is not installed"

# ExecStart= must name an existing executable: a stand-in, so the check does not
# depend on the build (verify reads units; it never runs the daemon).
cp "$ROOT"/systemd/rdmaxd.service "$ROOT"/systemd/rdmaxd.socket "$ROOT"/systemd/rdmaxd-admin.socket "$T/"
printf '#!/bin/sh\nexit 0\n' >"$T/rdmaxd"
chmod 0755 "$T/rdmaxd"
sed -i "s|^ExecStart=/usr/sbin/rdmaxd\$|ExecStart=$T/rdmaxd|" "$T/rdmaxd.service"
grep -qx "ExecStart=$T/rdmaxd" "$T/rdmaxd.service" || fail "ExecStart= is not /usr/sbin/rdmaxd"
out=$(cd "$T" && systemd-analyze verify --man=no rdmaxd.service rdmaxd.socket rdmaxd-admin.socket 2>&1) ||
	fail "systemd-analyze verify failed: $out"
[ -z "$out" ] || fail "systemd-analyze verify warned: $out"
log "systemd-analyze verify: clean"

grep -qx 'Type=notify' "$T/rdmaxd.service" || fail "rdmaxd.service is not Type=notify"
grep -qx 'NotifyAccess=main' "$T/rdmaxd.service" || fail "NotifyAccess=main missing"
grep -qx 'LimitMEMLOCK=infinity' "$T/rdmaxd.service" || fail "LimitMEMLOCK=infinity missing"
grep -q '^PrivateDevices=' "$T/rdmaxd.service" && fail "PrivateDevices= hides /dev/infiniband"
grep -q '^RuntimeDirectory=' "$T/rdmaxd.service" && fail "a RuntimeDirectory= would delete the sockets on stop"
for fam in AF_UNIX AF_INET AF_INET6 AF_NETLINK AF_IB; do
	grep -q "^RestrictAddressFamilies=.*\b$fam\b" "$T/rdmaxd.service" || fail "$fam not allowed"
done
grep -qx 'FileDescriptorName=client' "$T/rdmaxd.socket" || fail "client socket unnamed"
grep -qx 'FileDescriptorName=admin' "$T/rdmaxd-admin.socket" || fail "admin socket unnamed"
grep -qx 'ListenSequentialPacket=/run/rdmaxd.sock' "$T/rdmaxd.socket" || fail "client socket path"
grep -qx 'ListenSequentialPacket=/run/rdmaxd-admin.sock' "$T/rdmaxd-admin.socket" || fail "admin socket path"
log "unit contents: as rdmaxd expects"

# The security report must stay in the "OK" band (exposure below 4).
if report=$(systemd-analyze security --offline=yes "$T/rdmaxd.service" 2>/dev/null); then
	level=$(echo "$report" | sed -n 's/.*Overall exposure level for rdmaxd.service: \([0-9.]*\).*/\1/p')
	[ -n "$level" ] || fail "no exposure level in systemd-analyze security output"
	awk -v l="$level" 'BEGIN { exit !(l < 4.0) }' || fail "exposure level $level is not below 4"
	log "systemd-analyze security: exposure $level"
fi
