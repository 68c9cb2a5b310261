#!/bin/bash
# SPDX-License-Identifier: MIT
# The benchmark's own arithmetic, run by `make check`: tcp-stream reports each
# end's CPU and wait, and report.py's sender line splits tcp@1MiB into share x
# cost from the JSON that rdmax-bench and tcp-stream write, and tcp_vs_best takes
# the fastest stream reference. Fixture files with
# known figures, so every printed factor is checked, and one short real stream.
set -eu
build=${RDMAX_BUILD:-build}
dir=$(mktemp -d /tmp/rdmax-bench-selftest.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() {
	echo "bench selftest: $*" >&2
	exit 1
}

# A real stream: both ends' CPU and waits are in the JSON.
"$build/tests/bench/tcp-stream" -s 64K -n 2000 --spin --json >"$dir/stream.json" ||
	fail "tcp-stream failed"
"${PYTHON:-python3}" - "$dir/stream.json" <<'PY' || fail "tcp-stream JSON lacks an end's CPU or wait"
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
for k in ("send_cpu_s", "recv_cpu_s", "send_wait_s", "recv_wait_s"):
    assert r[k] >= 0, k
assert r["send_cpu_s"] > 0 and r["recv_cpu_s"] > 0, r
assert abs(r["cpu_s_per_GB"] * r["jobs"] * r["bytes"] / 1e9
           - (r["send_cpu_s"] + r["recv_cpu_s"])) < 0.01, r
PY

# Fixtures: rdmax's sending daemon ran 0.8 s of 1 s at 0.1 s/GB (8 GB/s), the stream's
# sender 1.0 s at 0.1 s/GB (10 GB/s): tcp@1MiB 0.80 = share 0.80 x cost 1.00. A second pair
# at 0.9 s / 0.09 s/GB and 1.0 s / 0.1: share 0.90 x cost 1.11.
mkdir -p "$dir/out"
row() { # FILE GBPS RUN WAIT IDLE (rdmax) | FILE GBPS SEND_CPU SEND_WAIT (stream)
	if [ "$#" = 5 ]; then
		printf '{"status": "ok", "label": "host tcp_write", "results": [{"bytes": 1048576, "seconds": 1.0, "Gbps": %s, "jobs_per_s": 1, "lat_us": {"p50": 0, "p99": 0, "p999": 0, "mean": 0}, "daemon_cpu_s_per_GB": 0.1, "peer_cpu_s_per_GB": 0.1, "daemon_run_s": %s, "daemon_wait_s": %s, "host_idle": %s}]}\n' \
			"$2" "$3" "$4" "$5" >"$1"
	else
		printf '{"status": "ok", "label": "host tcp_write spin", "results": [{"bytes": 1048576, "seconds": 1.0, "Gbps": %s, "jobs_per_s": 1, "lat_us": {"p50": 0, "p99": 0, "p999": 0, "mean": 0}, "cpu_s_per_GB": 0.2, "send_cpu_s": %s, "send_wait_s": %s, "recv_cpu_s": 1.0, "recv_wait_s": 0}]}\n' \
			"$2" "$3" "$4" >"$1"
	fi
}
row "$dir/out/host-rdmax-tcp_write-1048576-r1.json" 64 0.8 0.2 0.05
row "$dir/out/host-ref@spin-tcp_write-1048576-r1.json" 80 1.0 0.0
row "$dir/out/host-rdmax-tcp_write-1048576-r2.json" 80 0.9 0.1 0.05
row "$dir/out/host-ref@spin-tcp_write-1048576-r2.json" 80 1.0 0.0
# The blocking stream, faster here than the spinning one, is a reference of tcp_vs_best.
row "$dir/out/host-ref-tcp_write-1048576-r1.json" 100 1.0 0.0
row "$dir/out/host-ref-tcp_write-1048576-r2.json" 100 1.0 0.0
echo cubic >"$dir/out/host-tcp-cc.txt"
"${PYTHON:-python3}" tests/bench/report.py "$dir/out" >"$dir/report.txt" || fail "report.py failed"
grep -q '^host rows: TCP congestion control cubic for every stream$' "$dir/report.txt" ||
	fail "report.py does not name the congestion control"
# Medians over the two pairs: rdmax share 0.85, cost 0.1 and 0.09 -> median 0.095.
"${PYTHON:-python3}" - "$dir/out/summary.json" <<'PY' || fail "sender split or tcp_vs_best wrong: $(grep sender "$dir/report.txt")"
import json, sys
s = json.load(open(sys.argv[1]))["tcp_sender"]
near = lambda a, b: abs(a - b) < 1e-3
assert near(s["rdmax_share"], 0.85) and near(s["ref_share"], 1.0), s
assert near(s["rdmax_cost"], 0.095) and near(s["ref_cost"], 0.1), s
assert near(s["share"], 0.85) and near(s["cost"], 0.1 / 0.095), s
assert near(s["rdmax_wait"], 0.15) and near(s["idle"], 0.05) and s["runs"] == 2, s
# Per pair the product is the pair's ratio: 64/80 = 0.8 x 1.0, 80/80 = 0.9 x 0.1/0.09.
(s1, c1), (s2, c2) = s["pairs"]
assert near(s1, 0.8) and near(c1, 1.0) and near(s2, 0.9) and near(c2, 0.1 / 0.09), s
assert near(s1 * c1, 64 / 80) and near(s2 * c2, 80 / 80), s
# tcp_vs_best: rdmax's median 72 Gb/s against the fastest reference, the blocking 100.
best = json.load(open(sys.argv[1]))["ratios"]["tcp_vs_best@1MiB"]
assert near(best, 0.72), best
PY
grep -q 'tcp@1MiB = share 0.85 x cost 1.05;.* each pair, share x cost: 0.80 x 1.00, 0.90 x 1.11$' \
	"$dir/report.txt" || fail "sender line: $(grep sender "$dir/report.txt")"
echo "bench selftest: ok"
