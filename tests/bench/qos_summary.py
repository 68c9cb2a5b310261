#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The summary of tests/bench/qos.sh: medians and spreads of its runs' JSON (and,
over verbs, perftest's text) in OUT, per [qos] setting, against the raw
references, as host-qos-summary.txt (guest-qos-verbs-summary.txt) holds it.

usage: qos_summary.py OUT REPS LOAD_BEFORE LOAD_AFTER LAT_SPIN_US PREFIX WHERE
PREFIX is host-qos (TCP on loopback) or guest-qos-verbs (verbs in the guest)."""
import json, statistics, sys, glob
out, reps, pre = sys.argv[1], int(sys.argv[2]), sys.argv[6]
def vals(mode, test, key):
    v = []
    prefix = "host-qos" if mode == "raw" else pre
    for f in sorted(glob.glob("%s/%s-%s-%s-r*.json" % (out, prefix, mode, test))):
        r = json.load(open(f))["results"][0]
        v.append(r["lat_us"][key] if key != "GBps" else r["GBps"])
    return v
def fmt(v, unit):
    if not v:
        return "n/a"
    return "%.1f %s (%s)" % (statistics.median(v), unit, ", ".join("%.1f" % x for x in v))
print("traffic classes, %s, %d repetitions (median, then each run); "
      "load average %s before, %s after; latency client RDMAX_SPIN_US=%s"
      % (sys.argv[7], reps, sys.argv[3], sys.argv[4], sys.argv[5]))
for mode in ("off", "on", "pinned", "nodes"):
    if mode in ("pinned", "nodes") and not vals(mode, "idle", "p99"):
        continue
    idle50, idle99 = vals(mode, "idle", "p50"), vals(mode, "idle", "p99")
    mix50, mix99 = vals(mode, "mixedlat", "p50"), vals(mode, "mixedlat", "p99")
    bulk = [x * 1000 for x in vals(mode, "bulk", "GBps")]
    mixb = [x * 1000 for x in vals(mode, "mixedbulk", "GBps")]
    print("[qos] %s" % mode)
    print("  latency 64K idle      p50 %s   p99 %s" % (fmt(idle50, "us"), fmt(idle99, "us")))
    print("  latency 64K + bulk    p50 %s   p99 %s" % (fmt(mix50, "us"), fmt(mix99, "us")))
    print("  bulk 8M alone         %s" % fmt(bulk, "MB/s"))
    print("  bulk 8M + latency     %s" % fmt(mixb, "MB/s"))
    if idle99 and mix99 and bulk and mixb:
        r99 = statistics.median(mix99) / statistics.median(idle99)
        rb = statistics.median(mixb) / statistics.median(bulk)
        print("  p99 under load / idle p99 = %.2f (target <= 2)   bulk with / without "
              "latency = %.2f (target >= 0.9)" % (r99, rb))
    if mode == "pinned" and mixb and vals("on", "bulk", "GBps"):
        rb_on = statistics.median(mixb) / statistics.median(
            [x * 1000 for x in vals("on", "bulk", "GBps")])
        print("  bulk with latency, pinned / bulk alone, [qos] on unpinned = %.2f "
              "(what the CPU given to the loops costs the bulk class)" % rb_on)
    # The relayed ping-pong is TCP's reference (its files are host-qos-raw-*,
    # which a verbs run in the guest may find beside its own).
    if mode in ("on", "pinned", "nodes") and pre == "host-qos":
        where = {"on": "unpinned, lane open", "pinned": "on CPU 0", "nodes": "node by node"}[mode]
        refs = [("relayed ping-pong", "relay")]
        if mode == "on":
            # The same relay waiting in epoll_wait(), as an event loop waits.
            refs.append(("relayed ping-pong in epoll_wait()", "relayep"))
        for name, tag in refs:
            idle, mixed = {"on": ("idle" + tag, "mixedrdmaxio" + tag)}.get(
                mode, ("idle%s%s" % (mode, tag), "mixed%s%s" % (mode, tag)))
            r50, r99 = vals("raw", idle, "p50"), vals("raw", idle, "p99")
            m50, m99 = vals("raw", mixed, "p50"), vals("raw", mixed, "p99")
            if not m99:
                continue
            print("  %s %s, idle  p50 %s   p99 %s" % (name, where, fmt(r50, "us"), fmt(r99, "us")))
            print("  %s %s, + bulk p50 %s   p99 %s" % (name, where, fmt(m50, "us"), fmt(m99, "us")))
            if r99:
                print("  its p99 under load / idle p99 = %.2f (the same layout without rdmax's code)"
                      % (statistics.median(m99) / statistics.median(r99)))
            if mix99:
                print("  rdmax's p99 under load / the %s's = %.2f"
                      % (name, statistics.median(mix99) / statistics.median(m99)))
# The machine's floor: the same ratios for a raw TCP ping-pong under a raw stream
# (over verbs: the perftest ping-pongs under ib_write_bw).
def ratio(num, den):
    return statistics.median(num) / statistics.median(den) if num and den else None
def perftest(test):
    typ, p99 = [], []
    for f in sorted(glob.glob("%s/%s-raw-%s-r*.txt" % (out, pre, test))):
        lines = open(f).read().splitlines()
        for i, l in enumerate(lines):
            if "#bytes" in l and i + 1 < len(lines) and len(lines[i + 1].split()) >= 8:
                v = lines[i + 1].split()
                typ.append(float(v[4]))
                p99.append(float(v[7]))
                break
    return typ, p99
def rawbulk_share():
    # The bulk target's floor under equal conditions: the same rdmax bulk load
    # beside latency traffic that never enters the daemons.
    alone = [x * 1000 for x in vals("on", "bulk", "GBps")]
    beside = [x * 1000 for x in vals("on", "rawbulk", "GBps")]
    mixed = [x * 1000 for x in vals("on", "mixedbulk", "GBps")]
    r, m = ratio(beside, alone), ratio(mixed, beside)
    if r is not None and m is not None:
        print("  [qos] on: rdmax bulk with the raw ping-pongs / alone = %.2f (what latency "
              "traffic that never enters the daemons costs the bulk load); bulk with rdmax's "
              "latency writes / with the raw ping-pongs = %.2f" % (r, m))
if pre != "host-qos":
    print("raw reference (perftest): 64K ping-pongs, ib_write_lat (ends spin) and "
          "ib_send_lat -e (ends sleep on completion events); half a round trip, typical "
          "and 99 %; load: ib_write_bw -s 8M -q 2, or rdmax's 8M bulk writes (before any "
          "latency job, the bulk posts on the loops; lane open: after the latency runs, "
          "the bulk posts on the posting threads, as rdmax's latency writes meet them)")
    for tool, tag in (("ib_write_lat ", ""), ("ib_send_lat -e", "ev")):
        idle = perftest("idle" + tag)
        print("  %s idle          typical %s   99%% %s" %
              (tool, fmt(idle[0], "us"), fmt(idle[1], "us")))
        for load, name in (("perf", "ib_write_bw"), ("rdmax", "rdmax bulk "),
                           ("rdmaxio", "rdmax bulk, lane open")):
            m = perftest("mixed" + load + tag)
            print("  %s + %s  typical %s   99%% %s" %
                  (tool, name, fmt(m[0], "us"), fmt(m[1], "us")))
            r = ratio(m[1], idle[1])
            if r is not None:
                print("    its 99%% under load / idle = %.2f" % r)
    bw = []
    for f in sorted(glob.glob("%s/%s-raw-loadperf-r*.txt" % (out, pre))):
        lines = open(f).read().splitlines()
        for i, l in enumerate(lines):
            if "#bytes" in l and i + 1 < len(lines) and len(lines[i + 1].split()) >= 4:
                bw.append(float(lines[i + 1].split()[3]))
                break
    print("  ib_write_bw 8M -q 2 with the ping-pongs      %s" % fmt(bw, "MB/s"))
    print("  rdmax bulk 8M with the ping-pongs            %s" %
          fmt([x * 1000 for x in vals("on", "rawbulk", "GBps")], "MB/s"))
    rawbulk_share()
    sys.exit(0)
print("raw reference (tcp-stream): 64K ping-pong; load: a raw 8M stream between two other "
      "processes, or rdmax's 8M bulk writes (rdmax: before any latency job, the copies on "
      "the daemons' loops; rdmax-io: the latency lane open, the copies on the I/O threads, "
      "as rdmax's latency writes meet the load); relayed: through a relay process, four "
      "hand-offs per round trip; relayed (epoll): its relay and receiver waiting in "
      "epoll_wait(), as an event loop such as rdmaxd's waits")
LOADS = {"block": "blocking", "spin": "spinning", "rdmax": "rdmax", "rdmaxio": "rdmax-io"}
# rdmax: the bulk load before any latency job, its copies on the daemons' loops;
# rdmax-io: the same load once the latency lane is open, its copies on the I/O threads,
# as rdmax's latency writes meet it.
raw = {}
for lat, tag in (("blocking", ""), ("spinning", "spin"), ("relayed", "relay"),
                 ("relayed (epoll)", "relayep")):
    idle50, idle99 = vals("raw", "idle" + tag, "p50"), vals("raw", "idle" + tag, "p99")
    print("  %-8s ping-pong idle              p50 %s   p99 %s" %
          (lat, fmt(idle50, "us"), fmt(idle99, "us")))
    for load in ("block", "spin", "rdmax", "rdmaxio"):
        m50 = vals("raw", "mixed" + load + tag, "p50")
        m99 = vals("raw", "mixed" + load + tag, "p99")
        if tag.startswith("relay") and load in ("block", "spin"):
            continue  # the relayed ping-pongs run under the rdmax load only
        if tag == "relayep" and load == "rdmax":
            continue  # the one waiting in epoll only once the lane is open
        if not tag.startswith("relay") and load == "rdmaxio":
            continue  # and they alone once the lane is open
        print("  %-8s ping-pong + %-8s %s p50 %s   p99 %s" %
              (lat, LOADS[load], "bulk  " if load.startswith("rdmax") else "stream", fmt(m50, "us"),
               fmt(m99, "us")))
        raw[(tag, load)] = (ratio(m50, idle50), ratio(m99, idle99))
for load in ("block", "spin"):
    print("  %s stream alone        %s" % ("blocking" if load == "block" else "spinning",
          fmt([x * 1000 for x in vals("raw", "load" + load, "GBps")], "MB/s")))
print("  rdmax bulk 8M with the raw ping-pongs %s" %
      fmt([x * 1000 for x in vals("on", "rawbulk", "GBps")], "MB/s"))
rawbulk_share()
on = (ratio(vals("on", "mixedlat", "p50"), vals("on", "idle", "p50")),
      ratio(vals("on", "mixedlat", "p99"), vals("on", "idle", "p99")))
if on[1] is not None:
    print("degradation under load (median under load / median idle), [qos] on: "
          "p50 %.1fx, p99 %.1fx" % on)
    for (tag, load), (r50, r99) in sorted(raw.items()):
        if r99 is None:
            continue
        print("  raw %-8s ping-pong, %-8s load: p50 %.1fx, p99 %.1fx; rdmax / raw: "
              "p50 %.2f, p99 %.2f" % ({"": "blocking", "spin": "spinning", "relay": "relayed",
                                       "relayep": "relayed (epoll)"}[tag], LOADS[load], r50,
                                       r99, on[0] / r50, on[1] / r99))
