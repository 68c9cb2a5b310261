#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Aggregate the runs of `make bench` into one table of ratios.

Reads the files tests/bench/run.sh and guest.sh leave in OUT (build/bench):
  guest-ref-TEST-SIZE-rN.txt      perftest client output
  guest-rdmax-TEST-SIZE-rN.json   rdmax-bench --json (verbs, in the guest)
  host-ref-TEST-SIZE-rN.json      tcp-stream --json
  host-rdmax-TEST-SIZE-rN.json    rdmax-bench --json (TCP transport / same node)
  PART-ref@TOOL-TEST-SIZE-rN.*    further references of the same row: tcp-stream
                                  --spin (spin, spinbatch, span, spinspan: .json), iperf3 --json
                                  (iperf3: .json), ucx_perftest output (ucx*: .txt),
                                  tests/bench/verbs-hop --hop output (hop: .txt),
                                  verbs-hop --code output (code: .txt), and both
                                  with a client's share of code (floor: .txt)
takes the median over repetitions of each side, prints the table and the
summary line, and writes OUT/summary.json. Every ratio is "higher is better":
rdmax/reference for bandwidth and rate, reference/rdmax for latency.
"""
import glob
import json
import os
import re
import statistics
import sys

NAME = re.compile(r"^(guest|host)-(ref|rdmax)(?:@([a-z0-9]+))?-([a-z_0-9]+)-(\d+)-r(\d+)\.(txt|json)$")
MIB = 1 << 20


def parse_ucx(path, size):
    """ucx_perftest client output plus the `cpu_s U S` lines of both ends."""
    final = None
    cpu = 0.0
    for line in open(path, errors="replace"):
        words = line.split()
        if words[:1] == ["Final:"] and len(words) >= 9:
            final = [float(w) for w in words[1:9]]
        elif words[:1] == ["cpu_s"] and len(words) >= 3:
            cpu += float(words[1]) + float(words[2])
    if final is None:
        return None
    iters, p50, _avg, _overall, _bw_avg, bw_overall, _rate_avg, rate_overall = final
    gb = iters * size / 1e9
    out = {"Gbps": bw_overall * MIB * 8 / 1e9, "jobs_per_s": rate_overall,
           # lat tests print half a round trip, like ib_write_lat: twice that is one
           # write (or message) answered, which is what a completed rdmax job is.
           "p50_us": 2 * p50,
           "cpu_s_per_GB": cpu / gb if gb > 0 and cpu > 0 else None}
    return out


def parse_iperf3(path):
    try:
        doc = json.load(open(path))
        end = doc["end"]
        recv = end["sum_received"]
    except (OSError, ValueError, KeyError):
        return None
    seconds = recv.get("seconds") or 0
    gb = recv.get("bytes", 0) / 1e9
    pct = end.get("cpu_utilization_percent", {})
    cpu = (pct.get("host_total", 0) + pct.get("remote_total", 0)) / 100 * seconds
    return {"Gbps": recv["bits_per_second"] / 1e9,
            "cpu_s_per_GB": cpu / gb if gb > 0 and cpu > 0 else None}


def parse_hop(path):
    """The line of tests/bench/verbs-hop: `verbs-hop hop ... p50 X us p99 Y us ... mean Z us`."""
    for line in open(path, errors="replace"):
        m = re.match(r"^verbs-hop .* p50 ([0-9.]+) us p99 ([0-9.]+) us", line)
        if m:
            val = {"p50_us": float(m.group(1)), "p99_us": float(m.group(2))}
            mean = re.search(r" mean ([0-9.]+) us \(", line)
            if mean:
                val["mean_us"] = float(mean.group(1))
            post = re.search(r"post call mean ([0-9.]+) us", line)
            if post:
                val["post_mean_us"] = float(post.group(1))
            return val
    return None


def parse_perftest(path):
    """Numbers of a perftest client run, or None when it reported none."""
    lines = open(path, errors="replace").read().splitlines()
    for i, line in enumerate(lines):
        if "#bytes" not in line or i + 1 >= len(lines):
            continue
        cols = lines[i + 1].split()
        try:
            vals = [float(c) for c in cols]
        except ValueError:
            return None
        if "BW average" in line and len(vals) >= 5:
            # bytes iters peak avg msgrate[Mpps], with --report_gbits
            return {"Gbps": vals[3], "jobs_per_s": vals[4] * 1e6}
        if "t_typical" in line and len(vals) >= 9:
            # bytes iters min max typical avg stdev p99 p99.9
            return {"p50_us": vals[4], "p99_us": vals[7], "p999_us": vals[8]}
    return None


def parse_json(path):
    try:
        doc = json.load(open(path))
    except (OSError, ValueError):
        return None
    if doc.get("status") != "ok" or not doc.get("results"):
        return None
    r = doc["results"][0]
    out = {
        "Gbps": r.get("Gbps"),
        "jobs_per_s": r.get("jobs_per_s"),
        "p50_us": r["lat_us"]["p50"],
        "mean_us": r["lat_us"].get("mean"),
        "p99_us": r["lat_us"]["p99"],
        "p999_us": r["lat_us"]["p999"],
        "label": doc.get("label", ""),
    }
    if "memcpy_GBps" in r:
        out["memcpy_Gbps"] = r["memcpy_GBps"] * 8
    cpu = [r.get(k) for k in ("daemon_cpu_s_per_GB", "peer_cpu_s_per_GB")]
    cpu = [c for c in cpu if c is not None]
    if cpu:
        out["cpu_s_per_GB"] = sum(cpu)
    elif r.get("cpu_s_per_GB") is not None:
        out["cpu_s_per_GB"] = r["cpu_s_per_GB"]
    # The sending end of a write stream: rdmax's requesting daemon (all its threads, as the
    # scheduler counts them), or tcp-stream's sender. Its share of a CPU over the run, the CPU
    # it spent per GB, and the share of the run it waited for a CPU while runnable.
    send = (r.get("daemon_run_s"), r.get("daemon_wait_s"))
    if send[0] is None:
        send = (r.get("send_cpu_s"), r.get("send_wait_s"))
    secs, gbps = r.get("seconds"), r.get("Gbps")
    if None not in send and secs and gbps:
        out["send_share"] = send[0] / secs
        out["send_cpu_s_per_GB"] = send[0] / (gbps / 8 * secs)
        out["send_wait_share"] = send[1] / secs
    if r.get("host_idle") is not None:
        out["host_idle"] = r["host_idle"]
    # rdmax-bench kv: every process of the row, per GB, and how often each was put on a CPU.
    for k in ("daemon_cpu_s_per_GB", "peer_cpu_s_per_GB", "prefill_cpu_s_per_GB",
              "decode_cpu_s_per_GB", "check_cpu_s_per_GB"):
        if r.get(k) is not None and r[k] >= 0:
            out["kv_" + k] = r[k]
    runs_per = r.get("runs_per_request")
    if isinstance(runs_per, dict) and all(v is not None and v >= 0 for v in runs_per.values()):
        out["kv_runs_per_request"] = sum(runs_per.values())
    return out


def load(out_dir):
    """{(part, test, size): {"ref": [runs], "rdmax": [runs], "ref@TOOL": [runs]}}"""
    runs = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "*"))):
        m = NAME.match(os.path.basename(path))
        if not m:
            continue
        part, side, tool, test, size, rep, ext = m.groups()
        if tool and tool.startswith("ucx"):
            val = parse_ucx(path, int(size))
        elif tool == "iperf3":
            val = parse_iperf3(path)
        elif tool in ("hop", "code", "floor"):
            val = parse_hop(path)
        elif ext == "txt":
            val = parse_perftest(path)
        else:
            val = parse_json(path)
        if val is None:
            continue
        if test == "write_rtt" and side == "ref" and not tool and val.get("jobs_per_s"):
            # ib_write_bw -t 1: one write at a time, so its rate gives the mean round trip
            # (it prints no percentiles): compared with rdmax's mean, not its p50.
            val["mean_us"] = 1e6 / val["jobs_per_s"]
        val["rep"] = int(rep)
        key = (part, test, int(size))
        runs.setdefault(key, {"ref": [], "rdmax": []}).setdefault(
            side + ("@" + tool if tool else ""), []).append(val)
    return runs


def med(vals, field):
    xs = [v[field] for v in vals if v.get(field) is not None]
    if not xs or any(x != x or x in (float("inf"),) for x in xs):
        return None
    if any(x <= 0 for x in xs):
        return None  # perftest under emulation may report 0: no reference then
    return statistics.median(xs)


def size_name(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}MiB"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}KiB"
    return f"{n}B"


# (part, test) -> what is compared, shown as rows
METRICS = {
    "write_bw": [("Gbps", "Gb/s", False), ("jobs_per_s", "jobs/s", False)],
    "read_bw": [("Gbps", "Gb/s", False)],
    "write_lat": [("p50_us", "p50 us", True), ("p99_us", "p99 us", True)],
    "write_rtt": [("p50_us", "p50 us", True), ("mean_us", "mean us", True)],
    "paged_bw": [("Gbps", "Gb/s", False)],
    "tcp_write": [("Gbps", "Gb/s", False)],
    "tcp_read": [("Gbps", "Gb/s", False)],
    "tcp_lat": [("p50_us", "p50 us", True), ("p99_us", "p99 us", True)],
    "tcp_paged": [("Gbps", "Gb/s", False)],
    "tcp_paged_read": [("Gbps", "Gb/s", False)],
    "tcp_kv": [("Gbps", "Gb/s", False)],
    "tcp_tls": [("Gbps", "Gb/s", False)],
    "same_node": [("Gbps", "Gb/s", False)],
    "write_1qp": [("Gbps", "Gb/s", False)],
    "read_1qp": [("Gbps", "Gb/s", False)],
    "kv": [("Gbps", "Gb/s", False)],
}
REFERENCE = {
    "write_bw": "ib_write_bw",
    "read_bw": "ib_read_bw",
    "write_lat": "ib_write_lat",
    "write_rtt": "ib_write_bw -t 1",
    "paged_bw": "ib_write_bw 16KiB",
    "tcp_write": "tcp-stream",
    "tcp_read": "tcp-stream",
    "tcp_lat": "tcp-stream --lat",
    "tcp_paged": "tcp-stream",
    "tcp_paged_read": "tcp-stream",
    "tcp_kv": "tcp-stream",
    "tcp_tls": "rdmaxd plain TCP",
    "same_node": "memcpy",
    "kv": "ib_write_bw",
}
# Further references, by tool; what each one is, as the table names it.
TOOLS = {
    "spin": "raw TCP spin",
    "spinbatch": "spin+batch16",
    "span": "raw TCP, 32MiB",
    "spinspan": "raw spin, 32MiB",
    "relay": "raw KV relays",
    "iperf3": "iperf3",
    "ucxtag": "UCX tag tcp",
    "ucxput": "UCX put tcp",
    "ucx": "UCX put 1QP",
    "ucxget": "UCX get 1QP",
    "plain": "rdmaxd plain TCP",
    "hop": "raw, process hop",
    "code": "raw, daemon's code",
    "floor": "raw, hop and code",
}
LAT_TOOLS = {"ucxtag": "UCX tag_lat x2", "ucxput": "UCX put_lat x2", "ucx": "UCX put_lat x2",
             "hop": "raw, process hop", "code": "raw, daemon's code",
             "floor": "raw, hop and code"}
ORDER = list(METRICS)


def build_rows(runs):
    rows = []
    keys = sorted(runs, key=lambda k: (k[0] != "guest", ORDER.index(k[1]) if k[1] in ORDER else 99, k[2]))
    for part, test, size in keys:
        allsides = runs[(part, test, size)]
        refs = [k for k in allsides if k.startswith("ref") and allsides[k]] or ["ref"]
        for ref_key in sorted(refs, key=lambda k: (k != "ref", k)):
            sides = {"ref": allsides.get(ref_key, []), "rdmax": allsides.get("rdmax", [])}
            tool = ref_key[4:] if "@" in ref_key else ""
            rows.extend(metric_rows(part, test, size, sides, tool))
    return rows


def metric_rows(part, test, size, sides, tool):
    """Rows of one (part, test, size) against one reference tool ("" = the default one)."""
    rows = []
    for field, unit, lower_better in METRICS.get(test, []):
        if tool.startswith("ucx") and field != "p50_us" and lower_better:
            continue  # ucx_perftest prints no p99
        if test == "write_rtt" and not tool and field != "mean_us":
            continue  # ib_write_bw -t 1 gives a mean only: mean against mean
        if test.startswith("write_bw") and field == "jobs_per_s" and size > 4096:
            continue  # job rate is reported for small writes only
        if tool == "iperf3" and field != "Gbps":
            continue
        ref_field = "memcpy_Gbps" if test == "same_node" else field
        ref = med(sides["rdmax" if test == "same_node" else "ref"], ref_field)
        val = med(sides["rdmax"], field)
        ratio = None
        if ref and val:
            ratio = ref / val if lower_better else val / ref
        # Ratio of each pair run back to back: the spread shows the machine's noise.
        pairs = []
        ref_side = sides["rdmax" if test == "same_node" else "ref"]
        for a in sides["rdmax"]:
            for b in ref_side:
                x, y = a.get(field), b.get(ref_field)
                if a["rep"] == b["rep"] and x and y and x > 0 and y > 0:
                    pairs.append(y / x if lower_better else x / y)
        labels = {v.get("label", "") for v in sides["rdmax"]}
        transport = "tcp" if part == "host" else "verbs"
        for label in labels:
            words = label.split()
            if part == "guest" and len(words) >= 2:
                transport = words[1]
        if test == "same_node":
            transport = "local"
        rows.append({
            "part": part,
            "test": test,
            "bytes": size,
            "metric": unit,
            "reference": (LAT_TOOLS.get(tool) if lower_better else None)
            or TOOLS.get(tool) or REFERENCE.get(test, "?"),
            "tool": tool or "default",
            "ref_value": ref,
            "rdmax_value": val,
            "ratio": ratio,
            "ratio_min": min(pairs) if pairs else None,
            "ratio_max": max(pairs) if pairs else None,
            "transport": transport,
            "reps": [len(sides["ref"]) if test != "same_node" else len(sides["rdmax"]),
                     len(sides["rdmax"])],
            "rdmax_cpu_s_per_GB": med(sides["rdmax"], "cpu_s_per_GB"),
            "ref_cpu_s_per_GB": med(sides["ref"], "cpu_s_per_GB"),
        })
    return rows


def fmt(v, unit=""):
    if v is None:
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 0.1:
        return f"{v:.2f}"
    return f"{v:.4f}"


def find(rows, part, test, size, metric, transport=None, tool="default"):
    for r in rows:
        if (r["part"], r["test"], r["bytes"], r["metric"], r["tool"]) == (
                part, test, size, metric, tool):
            if transport and r["transport"] != transport:
                return None
            return r["ratio"]
    return None


def worst(rows, part, test, size, metric, tools):
    """Ratio against the best of several references (size None: any size), or None."""
    ratios = [r["ratio"] for r in rows
              if (r["part"], r["test"], r["metric"]) == (part, test, metric)
              and (size is None or r["bytes"] == size) and r["tool"] in tools
              and r["ratio"] is not None]
    return min(ratios) if ratios else None


def scaling(out_dir):
    """Rows of tests/bench/scaling.sh: totals per number of client processes."""
    pat = re.compile(r"^host-scale-(bw|rate)-(\d+)-p(\d+)\.json$")
    per = {}
    for path in glob.glob(os.path.join(out_dir, "host-scale-*.json")):
        m = pat.match(os.path.basename(path))
        if not m:
            continue
        val = parse_json(path)
        key = (m.group(1), int(m.group(2)))
        per.setdefault(key, []).append(val)
    rss = {}
    try:
        rss = json.load(open(os.path.join(out_dir, "host-scale-rss.json")))
    except (OSError, ValueError):
        pass
    rows = []
    for n in sorted({k[1] for k in per}):
        row = {"clients": n}
        for test, field in (("bw", "Gbps"), ("rate", "jobs_per_s")):
            vals = per.get((test, n), [])
            ok = [v for v in vals if v and v.get(field)]
            row[test] = sum(v[field] for v in ok) if len(ok) == n else None
            row[test + "_peak_rss_kib"] = rss.get("peak_kib", {}).get(f"{test}-{n}")
        rows.append(row)
    return rows, rss


def print_scaling(rows, rss):
    if not rows:
        return
    print()
    print("scaling (host, TCP transport, N client processes on one daemon; sums over the "
          "processes)")
    header = (f"{'clients':>7} {'1MiB Gb/s':>10} {'per client':>10} {'64B jobs/s':>11} "
              f"{'per client':>10} {'RSS MiB bw':>10} {'RSS MiB rate':>12}")
    print(header)
    print("-" * len(header))
    for r in rows:
        n = r["clients"]

        def mib(k):
            return "n/a" if r.get(k) is None else f"{r[k] / 1024:.1f}"
        print(f"{n:>7} {fmt(r['bw']):>10} {fmt(r['bw'] / n if r['bw'] else None):>10} "
              f"{fmt(r['rate']):>11} {fmt(r['rate'] / n if r['rate'] else None):>10} "
              f"{mib('bw_peak_rss_kib'):>10} {mib('rate_peak_rss_kib'):>12}")
    if rss:
        print(f"daemon RSS: {rss.get('idle_kib', 0) / 1024:.1f} MiB idle before, "
              f"{rss.get('after_kib', 0) / 1024:.1f} MiB idle after")


def stages(runs, out_dir, part, test):
    """A latency row's rdmax runs by stage ([metrics] job_stages on daemon a; guest.sh's
    write_rtt, run.sh's tcp_lat): medians over the runs of each stage's mean, the rest of
    rdmax's mean, and (guest) the raw posters' post call means; None without stage files."""
    per = []
    for path in sorted(glob.glob(os.path.join(out_dir, f"{part}-stages-{test}-64-r*.json"))):
        try:
            per.append(json.load(open(path)))
        except (OSError, ValueError):
            continue
    if not per:
        return None
    got = {k: statistics.median(p[k + "_us"] for p in per) for k in ("queue", "post", "complete")}
    got["runs"] = len(per)
    row = runs.get((part, test, 64), {})
    mean = med(row.get("rdmax", []), "mean_us")
    got["rest"] = mean - sum(got[k] for k in ("queue", "post", "complete")) if mean else None
    for tool in ("hop", "code", "floor"):
        got[tool + "_post"] = med(row.get("ref@" + tool, []), "post_mean_us")
    return got


def sender_split(runs, part, test, size, tool):
    """The sending ends of one write row against one reference: share of a CPU, CPU per GB."""
    sides = runs.get((part, test, size), {})
    ours, ref = sides.get("rdmax", []), sides.get("ref@" + tool, [])
    out = {"rdmax_share": med(ours, "send_share"), "ref_share": med(ref, "send_share"),
           "rdmax_cost": med(ours, "send_cpu_s_per_GB"), "ref_cost": med(ref, "send_cpu_s_per_GB"),
           "rdmax_wait": med0(ours, "send_wait_share"), "ref_wait": med0(ref, "send_wait_share"),
           "idle": med0(ours, "host_idle"), "runs": min(len(ours), len(ref))}
    if None in (out["rdmax_share"], out["ref_share"], out["rdmax_cost"], out["ref_cost"]):
        return None
    out["share"] = out["rdmax_share"] / out["ref_share"]
    out["cost"] = out["ref_cost"] / out["rdmax_cost"]
    # Each back-to-back pair: there share x cost is the pair's ratio exactly (the medians'
    # product above only approximates the median ratio).
    out["pairs"] = []
    for a in ours:
        for b in ref:
            keys = ("send_share", "send_cpu_s_per_GB")
            if a["rep"] == b["rep"] and all(a.get(k) and b.get(k) for k in keys):
                out["pairs"].append((a["send_share"] / b["send_share"],
                                     b["send_cpu_s_per_GB"] / a["send_cpu_s_per_GB"]))
    return out


def kv_account(runs, size):
    """A KV row's CPU per GB by process against its references' two ends (medians): with the
    machine's CPUs full, the row's rate against a reference's is about the inverse of their
    CPU per GB, so this says which process's work the ratio is made of."""
    sides = runs.get(("host", "tcp_kv", size), {})
    ours = sides.get("rdmax", [])
    keys = ("daemon", "peer", "prefill", "decode")
    got = {k: med(ours, f"kv_{k}_cpu_s_per_GB") for k in keys}
    if None in got.values():
        return None
    totals = [sum(v[f"kv_{k}_cpu_s_per_GB"] for k in keys) for v in ours
              if all(v.get(f"kv_{k}_cpu_s_per_GB") is not None for k in keys)]
    if not totals:
        return None  # no run counted every process
    got["check"] = med(ours, "kv_check_cpu_s_per_GB")
    got["total"] = statistics.median(totals)
    got["runs_per_request"] = med(ours, "kv_runs_per_request")
    got["idle"] = med0(ours, "host_idle")
    got["runs"] = len(ours)
    for tool in ("iperf3", "span", "relay"):
        got[tool] = med(sides.get("ref@" + tool, []), "cpu_s_per_GB")
    # The relay reference's own clients, which the daemons' layout leaves the same.
    relay = [sum(v[f"kv_{k}_cpu_s_per_GB"] for k in keys) for v in sides.get("ref@relay", [])
             if all(v.get(f"kv_{k}_cpu_s_per_GB") is not None for k in keys)]
    got["relay_total"] = statistics.median(relay) if relay else None
    return got


def med0(vals, field):
    """Median of a field that may be 0 (a wait, an idle share), or None."""
    xs = [v[field] for v in vals if v.get(field) is not None]
    return statistics.median(xs) if xs else None


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "build/bench"
    runs = load(out_dir)
    rows = build_rows(runs)
    header = (f"{'part':6} {'test':10} {'size':>7} {'metric':7} {'reference':>17} {'ref':>9} "
              f"{'rdmax':>9} {'ratio':>7} {'pairs':>13} {'cpu s/GB rdmax':>15} {'ref':>6}")
    print(header)
    print("-" * len(header))
    for r in rows:
        name = r["test"] if r["part"] == "host" or r["transport"] == "verbs" else f"{r['test']}*"
        spread = "n/a"
        if r["ratio_min"] is not None:
            spread = f"{fmt(r['ratio_min'])}-{fmt(r['ratio_max'])}"
        print(f"{r['part']:6} {name:10} {size_name(r['bytes']):>7} {r['metric']:7} "
              f"{r['reference']:>17} {fmt(r['ref_value']):>9} {fmt(r['rdmax_value']):>9} "
              f"{fmt(r['ratio']):>7} {spread:>13} {fmt(r['rdmax_cpu_s_per_GB']):>15} "
              f"{fmt(r['ref_cpu_s_per_GB']):>6}")
    if any(r["part"] == "guest" and r["transport"] != "verbs" for r in rows):
        print("* guest rows ran rdmaxd over TCP (RDMAX_BENCH_GUEST_TRANSPORT): not the verbs "
              "ratios, left out of the summary")
    cc_path = os.path.join(out_dir, "host-tcp-cc.txt")
    tcp_cc = open(cc_path).read().strip() if os.path.exists(cc_path) else None
    if tcp_cc:
        # Every host-side stream, rdmax's and the references', under the same one.
        print(f"host rows: TCP congestion control {tcp_cc} for every stream")
    skip = os.path.join(out_dir, "guest-skip.txt")
    if os.path.exists(skip):
        print("guest part skipped: " + open(skip).read().strip())

    def r(v):
        return "n/a" if v is None else f"{v:.2f}"

    summary = {
        "write@1MiB": find(rows, "guest", "write_bw", 1 << 20, "Gb/s", "verbs"),
        "write@64KiB": find(rows, "guest", "write_bw", 64 << 10, "Gb/s", "verbs"),
        "read@1MiB": find(rows, "guest", "read_bw", 1 << 20, "Gb/s", "verbs"),
        "lat_p50": find(rows, "guest", "write_lat", 64, "p50 us", "verbs"),
        "rate@64B": find(rows, "guest", "write_bw", 64, "jobs/s", "verbs"),
        "ucx_write@1MiB": find(rows, "guest", "write_1qp", 1 << 20, "Gb/s", "verbs", "ucx"),
        "ucx_lat": find(rows, "guest", "write_rtt", 64, "p50 us", "verbs", "ucx"),
        # Against the raw stream that polls like rdmaxd: the blocking tcp-stream row
        # measures the reference's wake-ups as much as the transport.
        "tcp@1MiB": find(rows, "host", "tcp_write", 1 << 20, "Gb/s", tool="spin"),
        "tcp_vs_ucx@1MiB": find(rows, "host", "tcp_write", 1 << 20, "Gb/s", tool="ucxtag"),
        # Every stream reference counts: under cubic the blocking stream can be the fastest.
        "tcp_vs_best@1MiB": worst(rows, "host", "tcp_write", 1 << 20, "Gb/s",
                                  ("iperf3", "spin", "ucxtag", "default")),
        # tcp_encryption = on against the same daemons' plain TCP, same run.
        "tcp_tls@1MiB": find(rows, "host", "tcp_tls", 1 << 20, "Gb/s", tool="plain"),
        "kv_tcp": worst(rows, "host", "tcp_kv", None, "Gb/s", ("iperf3",)),
        # The same clients over two raw relays where the daemons stand: rdmaxd's own share.
        "kv_tcp_vs_relay": worst(rows, "host", "tcp_kv", None, "Gb/s", ("relay",)),
        "kv_verbs": worst(rows, "guest", "kv", None, "Gb/s", ("default",)),
        "same_node@1MiB": find(rows, "host", "same_node", 1 << 20, "Gb/s"),
    }
    line = "ratios: " + " ".join(f"{k}={r(v)}" for k, v in summary.items())
    rtt = find(rows, "guest", "write_rtt", 64, "mean us", "verbs")
    hop = find(rows, "guest", "write_rtt", 64, "p50 us", "verbs", "hop")
    hop_mean = find(rows, "guest", "write_rtt", 64, "mean us", "verbs", "hop")
    code = find(rows, "guest", "write_rtt", 64, "p50 us", "verbs", "code")
    code_mean = find(rows, "guest", "write_rtt", 64, "mean us", "verbs", "code")
    floor = find(rows, "guest", "write_rtt", 64, "p50 us", "verbs", "floor")
    floor_mean = find(rows, "guest", "write_rtt", 64, "mean us", "verbs", "floor")
    if rtt is not None:
        # lat_p50 compares a completed job with half a ping-pong; this compares like with like.
        print(f"latency against one raw write waited for (ib_write_bw -t 1, mean against mean): "
              f"lat_rtt={r(rtt)}")
    if hop is not None:
        # The same raw write asked for through shared memory by a second process, waiting
        # as librdmax does: rdmaxd's process layout without its code, on the same NIC.
        print(f"latency against that write through a process hop (verbs-hop --hop, p50 against "
              f"p50): hop_rtt={r(hop)}, mean against mean: {r(hop_mean)}")
    if code is not None:
        # The raw write posted after as many instructions as rdmaxd runs per job: what the
        # emulator charges for a daemon's code (it also slows the emulated NIC's next post).
        print(f"latency against that write after about 5 600 instructions of other code "
              f"(verbs-hop --code 256, p50 against p50): code_rtt={r(code)}, mean against mean: "
              f"{r(code_mean)}")
    if floor is not None:
        # Both: the process hop with that code in the poster, spread over as much text as a
        # program's, and a client's share in the asker: a daemon design's floor on this NIC
        # with rdmax's amount of code (docs/benchmarks.md, "A daemon's floor").
        print(f"latency against that write through a process hop with rdmax's amount of code "
              f"(verbs-hop --hop --code 256 --code-span 4096 --asker-code 64, p50 against p50): "
              f"floor_rtt={r(floor)}, mean against mean: {r(floor_mean)}")

    def us(v):
        return "n/a" if v is None else f"{v:.1f}"
    st = stages(runs, out_dir, "guest", "write_rtt")
    if st is not None:
        # Daemon a's share of rdmax's write, timed in the daemon: the post call is where rxe
        # runs the whole round trip, against the same call in the raw posters.
        print(f"rdmax's completed write by stage (daemon a, mean µs, median of {st['runs']} runs): "
              f"queue {us(st['queue'])}, post call {us(st['post'])}, complete "
              f"{us(st['complete'])}; the rest of its mean (client, ring both ways) "
              f"{us(st['rest'])}; the raw post call's mean: {us(st['hop_post'])} (process hop), "
              f"{us(st['code_post'])} (after the code), {us(st['floor_post'])} (both)")
    tst = stages(runs, out_dir, "host", "tcp_lat")
    if tst is not None:
        # The same over TCP on loopback: the send call includes the loopback receive path.
        print(f"rdmax's completed 64 B write over TCP by stage (daemon a, mean µs, median of "
              f"{tst['runs']} runs): queue {us(tst['queue'])}, sendmsg {us(tst['post'])}, "
              f"complete {us(tst['complete'])}; the rest of its mean (client, ring both ways) "
              f"{us(tst['rest'])}")
    sender = sender_split(runs, "host", "tcp_write", 1 << 20, "spin")
    if sender is not None:
        # tcp@1MiB is the sending ends' CPU share times their cost per byte (both senders
        # copy in the kernel alike): which of the two a run's ratio moved with.
        print(f"the 1 MiB TCP write's sender against the spinning stream's (median of "
              f"{sender['runs']} runs): tcp@1MiB = share {r(sender['share'])} x cost "
              f"{r(sender['cost'])}; rdmax's sending daemon ran {r(sender['rdmax_share'])} of a "
              f"CPU (waited {r(sender['rdmax_wait'])} of the run for one, the machine "
              f"{r(sender['idle'])} idle), the stream's sender {r(sender['ref_share'])} (waited "
              f"{r(sender['ref_wait'])}); CPU s/GB {sender['rdmax_cost']:.3f} against "
              f"{sender['ref_cost']:.3f}; each pair, share x cost: "
              + ", ".join(f"{x:.2f} x {y:.2f}" for x, y in sender["pairs"]))
    kv = {}
    for size in (16 << 10, 128 << 10):
        acc = kv_account(runs, size)
        if acc is None:
            continue
        kv[size] = acc

        def of(ref, ours):
            return r(ref / ours) if ref else "n/a"
        # Which process's CPU the kv_tcp ratio is made of (docs/benchmarks.md, "Where the KV
        # row's CPU goes"): the clients stand for the serving processes, the daemons are rdmax.
        daemons = acc["daemon"] + acc["peer"]
        print(f"kv_tcp {size >> 10} KiB blocks, CPU s/GB by process (median of {acc['runs']} runs, "
              f"the machine {r(acc['idle'])} idle): sending daemon {acc['daemon']:.3f}, receiving "
              f"daemon {acc['peer']:.3f}, prefill clients {acc['prefill']:.3f}, decode client "
              f"{acc['decode']:.3f} (its check {r(acc['check'])}), all {acc['total']:.3f}; "
              f"iperf3's two ends {r(acc['iperf3'])}, {of(acc['iperf3'], acc['total'])} of the "
              f"row's; the blocking stream's through 32 MiB {r(acc['span'])}, "
              f"{of(acc['span'], acc['total'])} of it; the daemons alone {daemons:.3f}, iperf3's "
              f"ends {of(acc['iperf3'], daemons)} of it; processes put on a CPU per request "
              f"{r(acc['runs_per_request'])}; the raw relays' two ends {r(acc['relay'])}, "
              f"{of(acc['relay'], daemons)} of the daemons', all the relay row's processes "
              f"{r(acc['relay_total'])}")
    scale_rows, rss = scaling(out_dir)
    print_scaling(scale_rows, rss)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({"rows": rows, "ratios": summary, "line": line, "lat_rtt": rtt, "hop_rtt": hop,
                   "hop_rtt_mean": hop_mean, "code_rtt": code, "code_rtt_mean": code_mean,
                   "floor_rtt": floor, "floor_rtt_mean": floor_mean,
                   "write_rtt_stages": st, "tcp_lat_stages": tst, "tcp_sender": sender, "tcp_cc": tcp_cc,
                   "kv_account": {str(k): v for k, v in kv.items()},
                   "scaling": scale_rows, "rss": rss}, f, indent=1)
    print(line)


if __name__ == "__main__":
    main()
